// Fused multi-head scaled dot-product attention.
// Shape legend: B batch, H heads, T sequence (queries), S sequence (keys), D head dim.
// Packed documents: optional document ids (B, T) keep attention within each document.
#pragma once

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// softmax(q k^T * scale [+ causal mask]) v, per batch and head.
///  q (B, H, T, D), k and v (B, H, S, D) -> (B, H, T, D), f32; scale defaults to D^-0.5.
///  With `causal`, query t sees keys s <= t + (S - T); a query that sees no key (T > S)
///  gets 0 and passes no gradient.
/// The T x S score matrix lives only while one (b, h) is computed; the backward keeps
/// the row log-sum-exp (B, H, T) and recomputes scores per head. Heads run in parallel
/// (OpenMP); the per-head products are register-blocked AVX-512 GEMMs (no per-call
/// library setup) on blocks of 32 query rows, which for a causal mask stop at the last
/// visible key. Errors name "[attention]".
///
/// `compute` is the dtype the two products (q k^T and p v) may read: nn::Precision's
/// compute dtype. F32 computes in f32 on every device. BF16 lets a GPU run fused attention
/// on its tensor cores: cuDNN's SDPA where it loads and serves the problem (on bf16 copies
/// of q, k, v, which the backward keeps), else the own FlashAttention-2 kernels (heads up to
/// 128); q, k, v and the probabilities rounded to bf16, f32 accumulation, f32 softmax;
/// inputs, output and gradients stay f32 (see tensor::cuda_attention_library). The CPU, and
/// a GPU for larger heads or with DISTJAX_CUDA_ATTENTION=f32, compute in f32, more precise
/// than asked. F16 computes in f32 everywhere. Any other dtype is an InvalidArgument.
///
/// `out` is the output's dtype: F32, or the dtype a matmul will read it in (what a layer
/// under the bf16 policy casts it to next). The output is then that cast of the f32 result,
/// the same bits; a device whose attention writes bf16 (cuDNN's) hands its output over
/// as it is, without the round trip through f32.
///
/// `segments`, when given: document ids i32 (B, T) of a self-attention (T == S), the same
/// for queries and keys: query t sees key s only where the causal rule allows (if causal)
/// and segments[b, t] == segments[b, s]. Several documents packed into one sequence then
/// never attend across their boundary; entries across it pass no gradient. The output and
/// gradients of a document equal those of the document run alone (each row still sees its
/// own key). Any ids serve (a GPT counts the end-of-text tokens before each position). cuDNN's
/// attention takes no ids: a bf16 plan with ids runs the own kernels.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                 float scale = 0.f, DType compute = DType::F32, DType out = DType::F32,
                 const Tensor& segments = Tensor());

/// A partial attention: the output and row log-sum-exp of the query rows over some of the
/// keys. attention_block gives one; attention_merge folds another into it.
struct AttentionPart {
  Tensor out;  // (B, H, T, D) f32; 0 in rows that saw no key
  Tensor lse;  // (B, H, T) f32; -inf in rows that saw no key
  // The (query, key) pairs the kernel computed (visible under the mask), over every batch
  // row and head: 4 D flops each. attention_block's count, where the host can read the
  // positions (else 0); merged parts add theirs.
  std::int64_t pairs = 0;
};

/// The attention of query rows over one block of keys and values, for the blocks of a
/// longer sequence (ring attention): q (B, H, T, D) at global positions q_pos, k and v
/// (B, H, S, D) at k_pos; positions i32 (T) and (S), strictly ascending, the same for every
/// batch row and head (checked where the host can read them). With `causal`, query r sees
/// key c where k_pos[c] <= q_pos[r], so any placement of the blocks is right. f32 in and
/// out; scale defaults to D^-0.5. Not recorded on the tape: a differentiable blockwise
/// attention (parallel::ring_attention) records its own node, whose backward runs
/// attention_block_backward. Errors name "[attention_block]".
AttentionPart attention_block(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& q_pos, const Tensor& k_pos, bool causal = true,
                              float scale = 0.f);

/// Folds `part` into `acc` in place (the online-softmax rescale): acc then holds the
/// attention over the keys of both. The merge of every block's part, in any order, is the
/// attention over all the keys. Errors name "[attention_merge]".
void attention_merge(AttentionPart& acc, const AttentionPart& part);

struct AttentionGrads {
  Tensor dq, dk, dv;
};

/// One block's share of the gradients of a blockwise attention: from the whole attention's
/// output `out` and log-sum-exp `lse` (all blocks merged) and the cotangent `g_out` of
/// `out`, dq is what these keys give the queries (sum it over the key blocks), dk and dv
/// what these queries give these keys (sum them over the query blocks). Arguments as
/// attention_block's. Errors name "[attention_block_backward]".
AttentionGrads attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& q_pos, const Tensor& k_pos,
                                        const AttentionPart& whole, const Tensor& g_out,
                                        bool causal = true, float scale = 0.f);

/// The same attention read straight from a fused projection, without the permutes and
/// splits that would cut q, k and v out of it: qkv (B, T, 3 H D), viewed as
/// (B, T, H, 3, D) (per head its q, k and v rows side by side, the layout that
/// nn::MultiHeadAttention's reshape to (B, T, H, 3, D) expects), -> (B, T, H D), heads
/// side by side per position. Equal to reshaping qkv to (B, T, H, 3, D), permuting it
/// to (3, B, H, T, D), calling attention(q, k, v, causal, scale) and permuting the
/// result back to (B, T, H, D); `compute` and `out` as attention's. qkv may also come in
/// the compute dtype (a projection that wrote bf16: LinearEpilogue::out): the bf16 entries
/// read it as it is and hand its cotangent back in bf16; f32 kernels widen it. Errors name
/// "[attention_packed]". `segments` (B, T) as attention's.
Tensor attention_packed(const Tensor& qkv, std::int64_t num_heads, bool causal = true,
                        float scale = 0.f, DType compute = DType::F32, DType out = DType::F32,
                        const Tensor& segments = Tensor());

/// The dtype attention_packed reads a qkv of `qkv_shape` in as it is on `device` under
/// `compute`: bf16 where the device's bf16 entries serve the problem (cuDNN's attention on
/// CUDA), else f32 (its f32 kernels would widen a bf16 qkv first). What a projection
/// feeding it writes (nn::MultiHeadAttention). `segments`: whether document ids go with it.
DType attention_packed_input_dtype(const Shape& qkv_shape, std::int64_t num_heads, bool causal,
                                   DType compute, Device device, bool segments = false);

}  // namespace distjax::tensor
