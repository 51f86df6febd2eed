// Kernel family: Mixture-of-Experts routing and expert products. The top-k of router
// scores, the dispatch plan (every (token, slot) pair's row in the expert order), the moves
// of rows between the token order and the expert order with the gates, and products over
// groups of rows of ragged sizes (one weight matrix per group). Plain arguments only.
//
// Shape legend: n tokens, k slots per token (top-k), e experts, d row width, m rows in the
// expert order (the pairs kept).
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

/// A grouped product: rows [offsets[g], offsets[g + 1]) of A (rows x k, src dtype) belong to
/// group g < groups, whose matrix is B_g = b + g k n (k x n, or n x k with tb; src dtype).
struct GroupedGemmKey {
  std::int64_t groups, rows, n, k;
  bool tb = false;
  DType src = DType::F32;
  bool operator==(const GroupedGemmKey&) const = default;
};

struct MoeKernels {
  /// indices[i k + j] (i32) = the column of row i of `scores` (n x e, f32) holding its
  /// j-th largest value, largest first; of equal values the lower column first. k <= e.
  void (*top_k)(const float* scores, std::int64_t n, std::int64_t e, std::int64_t k,
                std::int32_t* indices);
  /// out[i k + j] = src[i e + idx[i k + j]] (f32).
  void (*take_columns)(const float* src, const std::int32_t* idx, std::int64_t n, std::int64_t e,
                       std::int64_t k, float* out);
  /// Its backward: dsrc (n x e, written whole) = zeros, plus g[i k + j] at column idx[i k + j]
  /// of row i, the slots added in order j = 0, 1, ...
  void (*take_columns_backward)(const float* g, const std::int32_t* idx, std::int64_t n,
                                std::int64_t e, std::int64_t k, float* dsrc);
  /// The dispatch plan of the n k pairs (token i / k, slot i % k) routed to experts[i] in
  /// [0, e). An expert keeps all its pairs when capacity < 0, else at most `capacity` of
  /// them: the first in token order, or with a `priority` (n k f32) the highest (of equal
  /// priorities the earlier pair). counts[g] (i32) = the pairs expert g keeps;
  /// position[i] (i32) = the kept pair's row in the expert order (expert 0's pairs first,
  /// each expert's in token order), -1 for a dropped pair.
  void (*dispatch_plan)(const std::int32_t* experts, const float* priority, std::int64_t n,
                        std::int64_t k, std::int64_t e, std::int64_t capacity,
                        std::int32_t* position, std::int32_t* counts);
  /// y[t] (d f32) = the sum over slots s < k in order of gates[t k + s] * src[position[t k +
  /// s]] (gates null: 1) over the kept pairs; zeros for a token that kept none. The combine,
  /// and (gates null) the dispatch's backward.
  void (*combine)(const float* src, const std::int32_t* position, const float* gates,
                  std::int64_t n, std::int64_t k, std::int64_t d, float* y);
  /// For every kept pair (t, s) with p = position[t k + s]: dst[p] = gates[t k + s] * g[t]
  /// (gates null: g[t], the dispatch itself); with dgates, dgates[t k + s] = the dot
  /// product of g[t] and src[p] (0 for a dropped pair): the combine's backward. Every row of
  /// dst is some kept pair's, so dst is written whole.
  void (*combine_backward)(const float* g, const float* src, const std::int32_t* position,
                           const float* gates, std::int64_t n, std::int64_t k, std::int64_t d,
                           float* dst, float* dgates);
  /// C (rows x n, f32) = for each group g its rows of A times B_g. `offsets` (groups + 1
  /// values, host memory) ascend from 0 to rows.
  void (*grouped_gemm)(const GroupedGemmKey& key, const std::int64_t* offsets, const void* a,
                       const void* b, float* c);
  /// The weight gradient: C_g = c + g k n (k x n, f32) = A_g^T B_g over group g's rows of A
  /// (rows x k, src) and B (rows x n, src); zeros for a group without rows. key.tb unused.
  void (*grouped_gemm_wgrad)(const GroupedGemmKey& key, const std::int64_t* offsets,
                             const void* a, const void* b, float* c);
};

}  // namespace distjax::tensor::detail
