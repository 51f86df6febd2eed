// Global-view matrix products and their propagation rule.
// Shapes: a (..., M, K), b (K, N), or (..., K, N) with a's batch dims; trans_b: b (N, K).
#pragma once

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// The rule of matmul: tries every output layout the inputs suggest (each batch, M, N
/// dimension keeps its operand's entry or none; the contraction K takes a's entry, b's,
/// or none) and keeps the one split over the most devices (never replicating work the
/// inputs' shardings divided), then the one whose input reshards plus the all-reduce of
/// a new partial output send the fewest bytes. A contraction split over axes gives an output
/// partial over them (resolved lazily by its consumer); an input's partial sums pass through when
/// the other input is replicated along their axes (the product is linear).
///   a P("data", None)  @ b P(None, "model") -> P("data", "model"), 0 bytes
///   a P(None, "model") @ b P("model", None) -> P() partial("model"), 0 bytes
///   a P() partial("model") @ b P()          -> P() partial("model"), 0 bytes
OpRule matmul_rule(const Shape& a, const GlobalSharding& sa, const Shape& b,
                   const GlobalSharding& sb, const Mesh& mesh, bool trans_b = false);

/// a @ b (or a @ b^T) on the local blocks after resharding by matmul_rule.
GlobalArray matmul(const GlobalArray& a, const GlobalArray& b, bool trans_b = false);

}  // namespace distjax::global
