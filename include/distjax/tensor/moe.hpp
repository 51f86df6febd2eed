// Mixture-of-Experts ops: routing (the top-k experts of each token, its gates), the
// dispatch plan, the dispatch of token rows into the expert order and their combine back
// with the gates, and products over the experts' ragged groups of rows. Megatron-Core's
// permute / unpermute and torchtitan's grouped matmul over offsets, as ops of the table.
// Shape legend: N tokens, k slots per token (top-k), E experts, D row width, M rows in the
// expert order (the pairs kept).
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// The largest k of the ops below.
constexpr std::int64_t kMaxTopK = 8;

/// scores (N, E) f32 -> (N, k) i32: the columns of each row's k largest values, largest
/// first; of equal values the lower column first. 1 <= k <= min(E, kMaxTopK). Not
/// differentiated (a selection).
Tensor top_k_indices(const Tensor& scores, std::int64_t k);

/// x (N, E) f32, indices (N, k) i32 in [0, E) -> (N, k): out[i, j] = x[i, indices[i, j]].
/// Differentiable in x (the cotangent scattered back, repeated columns adding up).
Tensor take_along_last(const Tensor& x, const Tensor& indices);

/// Where each (token, slot) pair of a routing goes: its row in the expert order (expert 0's
/// kept pairs first, each expert's in token order), or nowhere when its expert was full.
struct DispatchPlan {
  /// (N, k) i32: the pair's row in the expert order; -1 for a dropped pair.
  Tensor position{};
  /// Pairs each expert keeps (host values; their sum is rows()).
  std::vector<std::int64_t> counts{};
  /// Pairs each expert was chosen by, dropped ones included (host values).
  std::vector<std::int64_t> routed{};

  std::int64_t tokens() const { return position.defined() ? position.size(0) : 0; }
  std::int64_t top_k() const { return position.defined() ? position.size(1) : 0; }
  std::int64_t experts() const { return std::int64_t(counts.size()); }
  /// M: the rows of the expert order.
  std::int64_t rows() const;
  /// E + 1 values: expert g's rows are [offsets[g], offsets[g + 1]).
  std::vector<std::int64_t> offsets() const;
  /// The pairs dropped for capacity.
  std::int64_t dropped() const { return tokens() * top_k() - rows(); }
};

/// The plan of routing `experts` (N, k) i32 (values in [0, num_experts)) with at most
/// `capacity` pairs per expert (< 0: every pair, dropless). Over capacity an expert keeps
/// its first pairs in token order, or with a `priority` (N, k) f32 (e.g. the gates) its
/// highest (of equal ones the earlier). Reads the counts to the host (one wait on a GPU).
DispatchPlan dispatch_plan(const Tensor& experts, std::int64_t num_experts,
                           std::int64_t capacity = -1, const Tensor& priority = Tensor());

/// x (N, D) f32 -> (M, D): row position[t, s] is token t's row, for every kept pair.
/// Differentiable: the backward sums each token's kept slots (in slot order).
Tensor moe_dispatch(const Tensor& x, const DispatchPlan& plan);

/// y (M, D) f32 rows in the expert order -> (N, D): token t's row is the sum over its kept
/// slots s (in order) of gates[t, s] * y[position[t, s]]; `gates` (N, k) f32, or undefined
/// for 1. Differentiable in y and gates. With the gates of a token summing to 1 over slots
/// that all kept it, moe_combine(moe_dispatch(x)) is x up to rounding (exactly x with k = 1
/// and gate 1, or 1/k for k a power of two).
Tensor moe_combine(const Tensor& y, const DispatchPlan& plan, const Tensor& gates = Tensor());

/// Products of ragged groups of rows, one matrix per group: x (M, K) whose rows
/// [offsets[g], offsets[g + 1]) are group g's (offsets: E + 1 ascending values from 0 to M),
/// w (E, K, N) (or (E, N, K) with trans_w) -> (M, N) f32: rows of group g times w[g]. x and w
/// are both f32 or both bf16 (f32 sums). No loop over the groups in the op: one kernel call
/// (CPU: oneDNN's sgemm per group; CUDA: cuBLASLt per group). Differentiable in x and w (the
/// weight gradient of a group without rows is zero).
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<std::int64_t>& offsets,
                      bool trans_w = false);

}  // namespace distjax::tensor
