// Update ops: the optimizers' fused per-leaf updates (SGD, Adam/AdamW) and the pieces of
// gradient clipping (a sum of squares, a scale in place), each one pass over a leaf on its
// device through the kernel table. Not differentiable: they write their tensors in place.
#pragma once

#include <cstdint>
#include <span>

#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// One SGD step's coefficients (f32, as the update computes in f32).
struct SGDStep {
  float lr = 0.f;
  float momentum = 0.f;      ///< used with a momentum buffer
  float weight_decay = 0.f;  ///< L2 added to the gradient: g += wd * p
  bool nesterov = false;
};

/// SGD on one leaf, in place: with g' = grad + wd * param,
///   without a buffer (buf undefined): param -= lr * g'
///   with one: buf = mu * buf + g';  param -= lr * (nesterov ? g' + mu * buf : buf)
/// param, grad and a defined buf: f32 of one shape on one device.
void sgd_update_(Tensor& param, const Tensor& grad, Tensor& buf, const SGDStep& step);

/// One Adam/AdamW step's coefficients: step t (1-based, for the bias corrections),
/// `decay` the decoupled multiplier applied to the parameter first (AdamW: 1 - lr * wd;
/// 1 for none), `l2` the coupled L2 coefficient added to the gradient (Adam's weight decay).
struct AdamStep {
  double lr = 1e-3;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  std::int64_t t = 1;
  double decay = 1.0;
  double l2 = 0.0;
};

/// The fused Adam/AdamW update of one leaf, in place (PyTorch's formulation):
///   p = param * decay;  g = grad + l2 * p
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
///   param = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
/// param, grad, m, v: f32 of one shape on one device.
void adam_update_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamStep& step);

/// One leaf of a multi-leaf update (the optimizers' form of the two updates above: one
/// kernel call per device for all of a tree's leaves, which a GPU runs in a few launches
/// instead of one per leaf; the same bits as the per-leaf ops): param, grad and the state
/// tensors it uses, f32 of one shape on one device (leaves may sit on different devices).
struct UpdateLeaf {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* m = nullptr;  ///< Adam's first moment, or SGD's momentum buffer (null for none)
  Tensor* v = nullptr;  ///< Adam's second moment
  double decay = 1.0;   ///< Adam's decoupled multiplier for this leaf (AdamStep::decay unused)
};

/// sgd_update_ on every leaf (with its buffer `m` where set): every leaf is checked first,
/// then the leaves of each device (with a buffer or without) go to one sgd_many or
/// sgd_momentum_many kernel call, or leaf by leaf where their parameters share memory.
void sgd_update_many_(std::span<const UpdateLeaf> leaves, const SGDStep& step);

/// adam_update_ on every leaf, each with its own decay: every leaf is checked first, then
/// the leaves of each device go to one adam_many kernel call, or leaf by leaf where their
/// parameters share memory.
void adam_update_many_(std::span<const UpdateLeaf> leaves, const AdamStep& step);

/// Sum of the squares of an f32 tensor's elements, accumulated in f64 (one leaf's share of
/// a global norm). Read back to the host: a decision (clipping) follows it.
double sum_of_squares(const Tensor& x);
/// sum_of_squares of every tensor of xs (the same values), read back together: one wait
/// per device for all of them (on a GPU, one host sync rather than one per leaf).
std::vector<double> sums_of_squares(const std::vector<Tensor>& xs);

/// x *= factor (rounded to f32) in place; x is f32.
void scale_(Tensor& x, double factor);

/// A global norm and its clip factor, computed where the leaves are and left there.
struct NormAndClipFactor {
  Tensor norm;    ///< one f32 element: sqrt of the leaves' f64 sums of squares added in order
  Tensor factor;  ///< one f32 element: max_norm / norm when max_norm > 0 and norm > max_norm, else 1
};
/// The global norm of xs (f32 tensors on one device) and its clip factor, without a host
/// wait: what a step that clips needs when nothing on the host must decide on the norm.
/// The same bits as sums_of_squares added in order on the host, its sqrt, and
/// max_norm / norm, each rounded to f32 (the factor from the f64 norm).
NormAndClipFactor norm_and_clip_factor(const std::vector<Tensor>& xs, double max_norm);
/// x *= factor[0] in place: x f32, factor one f32 element on x's device (a clip factor the
/// device computed; no host wait).
void scale_by_(Tensor& x, const Tensor& factor);

}  // namespace distjax::tensor
