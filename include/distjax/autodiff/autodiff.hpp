// Reverse-mode autodiff over the per-thread tape: grad of tensors, value_and_grad of
// functions of parameter trees, custom VJPs and rematerialisation (checkpoint).
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::autodiff {

using tensor::Tensor;
using tensor::TensorTree;

/// Cotangents of `wrt` for the given outputs seeded with `seeds` (one per output,
/// same shape; undefined means ones for a scalar output). Tensors in `wrt` that the
/// outputs do not depend on get zeros. The traversed part of the tape is freed.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                         const std::vector<Tensor>& wrt);

/// Called during a backward pass as soon as the cotangent of wrt[index] is final (every
/// op that used it has run its backward), with that cotangent (its primal's varying
/// axes; zeros when the outputs do not depend on it, reported at the end). Lets a caller
/// start communicating a gradient while the backward pass goes on (data parallelism's
/// bucketed all-reduce). Called once per index, in the order the gradients become final,
/// which is the same on every device running the same program.
using GradReadyFn = std::function<void(std::size_t index, const Tensor& grad)>;

/// grad() that reports each cotangent to `on_ready` as soon as it is final.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                         const std::vector<Tensor>& wrt, const GradReadyFn& on_ready);

/// grad() that leaves undefined the cotangent of a `wrt` tensor the outputs do not reach
/// (or whose cotangent an op deferred, tensor::WeightGradStore) instead of allocating
/// zeros: a pipeline stage differentiates one chunk of its model at a time.
std::vector<Tensor> grad_if_reached(const std::vector<Tensor>& outputs,
                                    const std::vector<Tensor>& seeds,
                                    const std::vector<Tensor>& wrt);

namespace detail {
inline const Tensor& primary(const Tensor& t) {
  return t;
}
template <class A>
const Tensor& primary(const std::pair<Tensor, A>& p) {
  return p.first;
}
inline Tensor detached(const Tensor& t) {
  return t.detach();
}
template <class A>
std::pair<Tensor, A> detached(const std::pair<Tensor, A>& p) {
  return {p.first.detach(), p.second};
}
/// Leaves sharing storage with every floating leaf of `params`.
TensorTree make_leaves(const TensorTree& params);
/// Gradient of scalar `loss` with respect to every leaf of `leaves`; `on_ready` (optional)
/// gets each leaf's path and gradient as soon as it is final.
TensorTree grads_of(const Tensor& loss, const TensorTree& leaves,
                    const std::function<void(const std::string&, const Tensor&)>& on_ready = {});
}  // namespace detail

/// Turns `fn(params, args...) -> loss` (a scalar Tensor, or pair<Tensor, Aux>) into a
/// function returning {fn's result, gradient tree}. The gradient tree has exactly the
/// paths of `params`; leaves the loss does not use get zeros.
///
///   auto [loss, grads] = value_and_grad(loss_fn)(params, batch);
template <class F>
auto value_and_grad(F fn) {
  return [fn](const TensorTree& params, auto&&... args) {
    TensorTree leaves = detail::make_leaves(params);
    auto out = [&] {
      tensor::EnableGradGuard on;
      return fn(std::as_const(leaves), std::forward<decltype(args)>(args)...);
    }();
    TensorTree grads = detail::grads_of(detail::primary(out), leaves);
    return std::make_pair(detail::detached(out), std::move(grads));
  };
}

/// Like value_and_grad, returning the gradient tree only.
template <class F>
auto grad(F fn) {
  return [fn](const TensorTree& params, auto&&... args) {
    return value_and_grad(fn)(params, std::forward<decltype(args)>(args)...).second;
  };
}

/// Forward of a custom-VJP op: inputs -> outputs, run with grad mode off.
using CustomForward = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;
/// Backward of a custom-VJP op: (inputs, outputs, output cotangents; undefined = zero)
/// -> input cotangents (undefined = none).
using CustomBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs,
                                                         const std::vector<Tensor>& outputs,
                                                         const std::vector<Tensor>& grad_outputs)>;

/// Runs `forward` and records `backward` as its VJP: the tape does not look inside.
/// Inside shard_map the outputs vary over the union of the inputs' mesh axes and the tape
/// inserts the implicit pvary (`rule` Join, see tensor/grad_node.hpp); collectives, which
/// set their outputs' axes themselves, pass VaryingRule::AsIs.
std::vector<Tensor> custom_vjp(const char* name, const std::vector<Tensor>& inputs,
                               const CustomForward& forward, const CustomBackward& backward,
                               tensor::VaryingRule rule = tensor::VaryingRule::Join);
Tensor custom_vjp1(const char* name, const std::vector<Tensor>& inputs,
                   const CustomForward& forward, const CustomBackward& backward,
                   tensor::VaryingRule rule = tensor::VaryingRule::Join);

/// A function of a parameter tree and tensors, rematerialised by `checkpoint`.
using RematFn =
    std::function<std::vector<Tensor>(const TensorTree& params, const std::vector<Tensor>& inputs)>;

/// Rematerialisation: runs `fn` without keeping its intermediate activations and runs
/// it again during the backward pass to get them back. Everything `fn` differentiates
/// with respect to must come in through `params` or `inputs`, not through captures.
std::vector<Tensor> checkpoint(const RematFn& fn, const TensorTree& params,
                               const std::vector<Tensor>& inputs);

/// Whether this thread is inside a checkpoint's recomputation (its function run again in
/// the backward pass): what the first run reported (a layer's statistics) is not reported
/// twice.
bool recomputing();

/// `y` unchanged, with the scalar `loss` added to the objective for the backward pass: when
/// the tape reaches this op, `loss` gets the cotangent objective_scale() (as captured here),
/// the one it would get summed into the objective the caller differentiates. A layer deep
/// in a model adds an auxiliary loss this way (a Mixture-of-Experts layer's balancing
/// losses; Megatron-Core's MoEAuxLossAutoScaler), so the loss needs no path to the top:
/// it works inside a rematerialised block (the recomputation attaches it again) and in a
/// pipeline stage that does not hold the objective. Not differentiated: the identity.
///
///   y = autodiff::add_loss(y, tensor::mul_scalar(aux, coef));
Tensor add_loss(const Tensor& y, const Tensor& loss);

/// The factor by which whoever runs the backward pass has scaled the objective on this
/// thread: 1 unless an ObjectiveScale is alive (train::train_step's f16 loss scale, a
/// pipeline's 1 / m per micro-batch).
double objective_scale();

/// Multiplies objective_scale() by `factor` on this thread while it lives.
class ObjectiveScale {
 public:
  explicit ObjectiveScale(double factor);
  ~ObjectiveScale();
  ObjectiveScale(const ObjectiveScale&) = delete;
  ObjectiveScale& operator=(const ObjectiveScale&) = delete;

 private:
  double prev_;
};

}  // namespace distjax::autodiff
