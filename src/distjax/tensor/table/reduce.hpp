// Kernel family: reductions of f32 tensors viewed as (outer, r, inner), reducing the
// middle, and max's backward and argmax. Plain arguments only.
#pragma once

#include <cstdint>

#include "distjax/tensor/table/broadcast.hpp"

namespace distjax::tensor::detail {

enum class ReduceOp { Sum, Max };

struct ReduceKernels {
  /// out[o, i] = op over j < r of x[o, j, i]: x is (outer, r, inner), out (outer, inner).
  void (*reduce)(ReduceOp op, const float* x, float* out, std::int64_t outer, std::int64_t r,
                 std::int64_t inner);
  /// Max's backward over one run of axes: x (outer, r, inner), its maximum m and the
  /// cotangent g (outer, inner); out (zeroed, x's shape) gets g[o, i] at the first j where
  /// x[o, j, i] == m[o, i].
  void (*max_grad_run)(const float* x, const float* m, const float* g, float* out,
                       std::int64_t outer, std::int64_t r, std::int64_t inner);
  /// Max's backward, any axes: x, m and g of n elements each (m and g broadcast to x's
  /// shape); element i belongs to group broadcast_index(groups, i) of `ngroups`; out
  /// (zeroed) gets g[i] at the first i of each group where x[i] == m[i].
  void (*max_grad_general)(const float* x, const float* m, const float* g, float* out,
                           std::int64_t n, const BroadcastPlan& groups, std::int64_t ngroups);
  /// out[o, i] = the first j maximising x[o, j, i] (out i64).
  void (*argmax)(const float* x, std::int64_t* out, std::int64_t outer, std::int64_t r,
                 std::int64_t inner);
};

}  // namespace distjax::tensor::detail
