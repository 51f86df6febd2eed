// Global-view neural-network ops (softmax, norms, embedding lookup, cross-entropy) and
// their propagation rules. Shape legend: B batch, T sequence, C features, V vocabulary.
#pragma once

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// Rule of softmax / log_softmax along `axis`: that dimension is gathered (each row must
/// be whole), the others keep their splits; partial sums are resolved.
///   softmax(P("data", "model"), -1) -> P("data"), all_gather over model
OpRule softmax_rule(const Shape& shape, const GlobalSharding& s, int axis, const Mesh& mesh);
GlobalArray softmax(const GlobalArray& x, int axis = -1);
GlobalArray log_softmax(const GlobalArray& x, int axis = -1);

/// Rule of layer_norm / rms_norm over the last dimension: x (..., C) keeps its leading
/// splits, C is gathered, partial sums resolved; gamma and beta (C) are replicated.
///   layer_norm(P("data", None, "model")) -> P("data"), all_gather of x over model
OpRule norm_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                 const Mesh& mesh);
/// x (..., C), gamma (C), beta (C) or undefined.
GlobalArray layer_norm(const GlobalArray& x, const GlobalArray& gamma, const GlobalArray& beta,
                       float eps = 1e-5f);
GlobalArray rms_norm(const GlobalArray& x, const GlobalArray& gamma, float eps = 1e-6f);

/// Rule of embedding(table (V, C), ids (...)) -> (..., C): the ids keep their splits
/// (minus axes the table uses), C keeps the table's split, and a table split over the
/// vocabulary gives an output partial over those axes (each device looks up the ids in
/// its rows, zeros elsewhere: Megatron's vocabulary-parallel embedding), no
/// communication in any case.
///   embedding(P("model", None), ids P("data")) -> P("data") partial("model"), 0 bytes
OpRule embedding_rule(const Shape& table, const GlobalSharding& st, const Shape& ids,
                      const GlobalSharding& si, const Mesh& mesh);
GlobalArray embedding(const GlobalArray& table, const GlobalArray& ids);

/// Rule of cross_entropy(logits (..., V), labels (...)) -> (...) per-example losses:
/// partial logits are resolved; the labels follow the logits' leading splits; logits
/// split over V stay split (vocabulary-parallel: three all-reduces of one value per
/// example, counted in the plan) when that moves fewer bytes than gathering V.
///   cross_entropy(P("data", None), labels P("data")) -> P("data"), 0 bytes
///   cross_entropy(P("data", "model"), P("data"))     -> P("data"), 3 small all_reduces
OpRule cross_entropy_rule(const Shape& logits, const GlobalSharding& sl, const Shape& labels,
                          const GlobalSharding& sy, const Mesh& mesh);
GlobalArray cross_entropy(const GlobalArray& logits, const GlobalArray& labels);

}  // namespace distjax::global
