// Kernel family: the optimizers' fused per-leaf updates (SGD, Adam/AdamW) and the gradient
// norm's pieces (a sum of squares, a scale in place). Plain arguments only: f32 pointers,
// element counts, scalars and the stream.
#pragma once

#include <cstdint>

#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::detail {

struct OptimKernels {
  /// p[i] -= lr * (g[i] + wd * p[i]), for i < n (SGD without momentum).
  void (*sgd)(float* p, const float* g, std::int64_t n, float lr, float wd, Stream s);
  /// SGD with momentum buffer `buf` (heavy ball, or Nesterov's look-ahead), for i < n:
  /// g' = g + wd * p; buf = mu * buf + g'; p -= lr * (nesterov ? g' + mu * buf : buf).
  void (*sgd_momentum)(float* p, const float* g, float* buf, std::int64_t n, float lr, float mu,
                       float wd, bool nesterov, Stream s);
  /// The fused Adam/AdamW step t (1-based, for the bias corrections) on n elements: p is
  /// multiplied by `decay` first (decoupled weight decay; 1 for none), `l2` times it is
  /// added to g (coupled L2), then the moments m and v and p are updated (PyTorch's
  /// formulation: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps).
  void (*adam)(float* p, const float* g, float* m, float* v, std::int64_t n, double lr, double b1,
               double b2, double eps, std::int64_t t, double decay, double l2, Stream s);
  /// *host_out = sum of x[i]^2 for i < n, accumulated in f64.
  void (*sum_squares)(const float* x, std::int64_t n, double* host_out, Stream s);
  /// x[i] *= f, for i < n.
  void (*scale)(float* x, std::int64_t n, float f, Stream s);
};

}  // namespace distjax::tensor::detail
