// Fused multi-head scaled dot-product attention.
// Shape legend: B batch, H heads, T sequence (queries), S sequence (keys), D head dim.
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
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                 float scale = 0.f);

/// The same attention read straight from a fused projection, without the permutes and
/// splits that would cut q, k and v out of it: qkv (B, T, 3 H D), viewed as
/// (B, T, H, 3, D) (per head its q, k and v rows side by side, the layout that
/// nn::MultiHeadAttention's reshape to (B, T, H, 3, D) expects), -> (B, T, H D), heads
/// side by side per position. Equal to reshaping qkv to (B, T, H, 3, D), permuting it
/// to (3, B, H, T, D), calling attention(q, k, v, causal, scale) and permuting the
/// result back to (B, T, H, D). Errors name "[attention_packed]".
Tensor attention_packed(const Tensor& qkv, std::int64_t num_heads, bool causal = true,
                        float scale = 0.f);

}  // namespace distjax::tensor
