// Kernel family: data movement of the shape ops (permutation, broadcasting copies); slices
// and concatenation use the copy family's copy_2d. Plain arguments only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/tensor/table/broadcast.hpp"

namespace distjax::tensor::detail {

struct ShapeKernels {
  /// dst (contiguous, plan.dims) = src permuted: dst's element at coordinates c is src's
  /// at sum_d c[d] * plan.strides[d]; elements of `elem_size` bytes, n of them.
  void (*permute)(const void* src, void* dst, std::size_t elem_size, const PermutePlan& plan,
                  std::int64_t n);
  /// out = x broadcast to out's n elements by plan q (f32).
  void (*broadcast)(const float* x, const BroadcastPlan& q, float* out, std::int64_t n);
};

}  // namespace distjax::tensor::detail
