// Global-view causal self-attention and its rule. Shapes: q, k, v (B, H, T, D); packed
// qkv (B, T, 3C) laid out (B, T, H, 3, D) as nn::MultiHeadAttention makes it.
#pragma once

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// Rule of attention(q, k, v): B and H keep q's splits (k and v follow), T and D are
/// gathered (every query sees every key), partial sums resolved. Heads split over the
/// model axis is Megatron's attention: no communication.
///   q, k, v P("data", "model") -> P("data", "model"), 0 bytes
OpRule attention_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                      const Mesh& mesh);
GlobalArray attention(const GlobalArray& q, const GlobalArray& k, const GlobalArray& v,
                      bool causal = true);

/// Rule of attention_packed(qkv (B, T, 3C), H) -> (B, T, C): B keeps its split, T is
/// gathered, the features keep a split over n devices when n divides H (each device
/// holds whole heads: H/n of them), else are gathered.
///   qkv P(None, None, "model") -> P(None, None, "model"), 0 bytes
OpRule attention_packed_rule(const Shape& shape, const GlobalSharding& s, std::int64_t num_heads,
                             const Mesh& mesh);
GlobalArray attention_packed(const GlobalArray& qkv, std::int64_t num_heads, bool causal = true);

}  // namespace distjax::global
