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
/// (OpenMP); the per-head products are oneDNN GEMMs on blocks of 32 query rows, which for a
/// causal mask stop at the last visible key. Errors name "[attention]".
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                 float scale = 0.f);

}  // namespace distjax::tensor
