// Kernel family: fused multi-head attention, forward and backward, over heads laid out by
// one descriptor (the (B, H, T, D) layout of q, k, v and o, or q, k and v read in place
// from a packed (B, T, H, 3, D) projection). Plain arguments only.
// Shape legend: B batch, H heads, T queries, S keys, D head size.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

// The plan's helpers serve the CUDA kernels too (compiled for the device under nvcc).
#if defined(__CUDACC__)
#define DISTJAX_PLAN_FN __host__ __device__
#else
#define DISTJAX_PLAN_FN
#endif

namespace distjax::tensor::detail {

/// The sizes and layout of an attention problem: bh = B * H heads, each q (T, D), k and
/// v (S, D), o (T, D), their rows `ldq`, `ldkv`, `ldo` elements apart; head i = b H + j
/// starts at b * x_b + j * x_h elements in operand x.
struct AttentionPlan {
  std::int64_t bh, t, s, d;
  // Row strides (elements) of q (and dq), k and v (and dk, dv), o (and dO): d for the
  // (B, H, T, D) layout; 3 H D and H D for the packed (B, T, H, 3, D) / (B, T, H, D) one.
  std::int64_t ldq, ldkv, ldo;
  std::int64_t heads;  // H
  std::int64_t q_b, q_h, kv_b, kv_h, o_b, o_h;
  bool causal;
  float scale;
  // Whether the two products may read bf16-rounded operands (q, k, v, and the
  // probabilities and dS between the products) with f32 accumulation, as tensor cores do:
  // the bf16 policy's attention. A kernel may compute them in f32 instead (the CPU's do).
  bool bf16_products = false;
  // Document (segment) ids, i32 (B, T) with T == S, or null: query row r of head h sees key
  // c only where ids[r] == ids[c] (ids = segments + h / segment_heads * t, the row of h's
  // batch), on top of the causal rule. Packed documents that never attend across their
  // boundary. Every row sees at least its own key (T == S), so no row sees nothing.
  const std::int32_t* segments = nullptr;
  std::int64_t segment_heads = 1;  // heads per batch row of `segments` (H)
  // Global positions, or null: i32, strictly ascending, q_pos (T) of the query rows and
  // k_pos (S) of the keys, the same for every head: the blocks of a longer sequence (ring
  // attention's). With them the causal rule is by position, query row r seeing key c where
  // k_pos[c] <= q_pos[r]; without, by index, row r seeing the keys up to r + (S - T). Either
  // way the keys a row sees are a prefix, longer for later rows.
  const std::int32_t* q_pos = nullptr;
  const std::int32_t* k_pos = nullptr;
  // Keys visible to query row `row` (all of them without a mask).
  DISTJAX_PLAN_FN std::int64_t visible(std::int64_t row) const {
    if (!causal) return s;
    if (q_pos != nullptr) {  // the keys at positions <= q_pos[row]: a binary search
      const std::int32_t p = q_pos[row];
      std::int64_t lo = 0, hi = s;
      while (lo < hi) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        if (k_pos[mid] <= p) lo = mid + 1;
        else hi = mid;
      }
      return lo;
    }
    const std::int64_t v = row + 1 + (s - t);
    return v < 0 ? 0 : (v > s ? s : v);
  }
  // The first query row that sees key `col` (t when none does, or col >= s).
  DISTJAX_PLAN_FN std::int64_t first_row(std::int64_t col) const {
    if (!causal) return 0;
    if (col >= s) return t;
    if (q_pos != nullptr) {  // the first row at a position >= k_pos[col]
      const std::int32_t p = k_pos[col];
      std::int64_t lo = 0, hi = t;
      while (lo < hi) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        if (q_pos[mid] < p) lo = mid + 1;
        else hi = mid;
      }
      return lo;
    }
    const std::int64_t f = col - (s - t);
    return f < 0 ? 0 : f;
  }
  // Whether query row `row` (< t) of head h and key `col` (< s) lie in one document
  // (always without segments).
  DISTJAX_PLAN_FN bool same_document(std::int64_t h, std::int64_t row, std::int64_t col) const {
    if (segments == nullptr) return true;
    const std::int32_t* ids = segments + h / segment_heads * t;
    return ids[row] == ids[col];
  }
  // Where head h starts in each operand (elements).
  DISTJAX_PLAN_FN std::int64_t q_at(std::int64_t h) const { return h / heads * q_b + h % heads * q_h; }
  DISTJAX_PLAN_FN std::int64_t kv_at(std::int64_t h) const {
    return h / heads * kv_b + h % heads * kv_h;
  }
  DISTJAX_PLAN_FN std::int64_t o_at(std::int64_t h) const { return h / heads * o_b + h % heads * o_h; }
};

struct AttentionKernels {
  /// o = softmax(scale * q k^T [causal mask] [document mask]) v per head and lse (bh, T) = each
  /// row's log-sum-exp of the scaled scores (-inf for a row that sees no key; its o row is 0).
  void (*forward)(const AttentionPlan& a, const float* q, const float* k, const float* v, float* o,
                  float* lse);
  /// dq, dk, dv (written, at the layout of q, k, v) from the forward's q, k, v, o, lse and
  /// the cotangent go of o (at o's layout).
  void (*backward)(const AttentionPlan& a, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* go, float* dq, float* dk,
                   float* dv);
  /// The online-softmax merge of a block's partial result into a running one, row by row
  /// (rows = bh T, each of d values, contiguous): lse = log(e^lse + e^lse_b) and
  /// o = e^(lse_old - lse) o + e^(lse_b - lse) o_b, in place. A row whose lse is -inf (no
  /// key seen yet) takes the block's; a block row at -inf changes nothing.
  void (*merge)(std::int64_t rows, std::int64_t d, float* o, float* lse, const float* o_b,
                const float* lse_b) = nullptr;

  // The same with bf16 operands and outputs (lse stays f32), for plans with bf16_products:
  // what a fused bf16 attention library (cuDNN's SDPA on CUDA) takes, so the op hands it
  // bf16 copies instead of f32 activations. Where serves_bf16 is null or says no for a
  // plan, the op runs the f32 entries above. Pointers are of `bf16` storage.
  bool (*serves_bf16)(const AttentionPlan& a) = nullptr;
  void (*forward_bf16)(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                       float* lse) = nullptr;
  void (*backward_bf16)(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* o, const float* lse, const bf16* go, bf16* dq, bf16* dk,
                        bf16* dv) = nullptr;
};

}  // namespace distjax::tensor::detail

#undef DISTJAX_PLAN_FN
