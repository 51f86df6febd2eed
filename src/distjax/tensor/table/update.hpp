// Kernel family: the optimizers' fused updates (SGD, Adam/AdamW), of one leaf or of many at
// once, and the gradient norm's pieces (a sum of squares, a scale in place, the norm and clip
// factor kept on the device). Plain arguments only: f32 pointers, element counts, scalars
// and small arrays of leaf records.
#pragma once

#include <cstdint>

namespace distjax::tensor::detail {

/// One leaf of a multi-leaf update: n f32 elements at each pointer. The leaves of one call
/// must not overlap (a GPU updates them concurrently).
struct OptimLeaf {
  float* p = nullptr;        ///< [n] the parameter
  const float* g = nullptr;  ///< [n] its gradient
  float* m = nullptr;        ///< [n] Adam's first moment, or SGD's momentum buffer (else null)
  float* v = nullptr;        ///< [n] Adam's second moment (else null)
  std::int64_t n = 0;
  double decay = 1.0;  ///< Adam's decoupled multiplier for this leaf (AdamW masks some leaves)
};

struct UpdateKernels {
  /// p[i] -= lr * (g[i] + wd * p[i]), for i < n (SGD without momentum).
  void (*sgd)(float* p, const float* g, std::int64_t n, float lr, float wd);
  /// SGD with momentum buffer `buf` (heavy ball, or Nesterov's look-ahead), for i < n:
  /// g' = g + wd * p; buf = mu * buf + g'; p -= lr * (nesterov ? g' + mu * buf : buf).
  void (*sgd_momentum)(float* p, const float* g, float* buf, std::int64_t n, float lr, float mu,
                       float wd, bool nesterov);
  /// The fused Adam/AdamW step t (1-based, for the bias corrections) on n elements: p is
  /// multiplied by `decay` first (decoupled weight decay; 1 for none), `l2` times it is
  /// added to g (coupled L2), then the moments m and v and p are updated (PyTorch's
  /// formulation: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps).
  void (*adam)(float* p, const float* g, float* m, float* v, std::int64_t n, double lr, double b1,
               double b2, double eps, std::int64_t t, double decay, double l2);
  /// The multi-leaf forms: for each of the `count` leaves, the same bits as the per-leaf
  /// kernel above on that leaf (adam with the leaf's own decay), in fewer launches on a GPU.
  /// Each leaf record's memory must be in the leaf's tensors the op dispatched with.
  void (*sgd_many)(const OptimLeaf* leaves, std::int64_t count, float lr, float wd);
  void (*sgd_momentum_many)(const OptimLeaf* leaves, std::int64_t count, float lr, float mu,
                            float wd, bool nesterov);
  void (*adam_many)(const OptimLeaf* leaves, std::int64_t count, double lr, double b1, double b2,
                    double eps, std::int64_t t, double l2);
  /// *host_out = sum of x[i]^2 for i < n, accumulated in f64.
  void (*sum_squares)(const float* x, std::int64_t n, double* host_out);
  /// host_out[i] = sum_squares of xs[i] (ns[i] elements) for i < count, each as
  /// sum_squares computes it, with one wait for all (a GPU: one host sync, not one per leaf).
  void (*sum_squares_many)(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                           double* host_out);
  /// x[i] *= f, for i < n.
  void (*scale)(float* x, std::int64_t n, float f);
  /// The global norm and the clip factor of `count` leaves, left in device memory (no host
  /// wait): norm = sqrt of the leaves' sum_squares added in leaf order in f64, written
  /// rounded to f32 to *norm_out; *factor_out = max_norm / norm (the f64 norm) rounded to
  /// f32 when max_norm > 0 and the norm exceeds it, else 1. The same bits as the host
  /// computing them from sum_squares_many.
  void (*norm_and_clip_factor)(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                               double max_norm, float* norm_out, float* factor_out);
  /// x[i] *= *factor (one f32 in device memory), for i < n: scale with a factor the device
  /// computed.
  void (*scale_by)(float* x, std::int64_t n, const float* factor);
};

}  // namespace distjax::tensor::detail
