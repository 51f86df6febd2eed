// Embedding: a lookup table of vectors, with the transposed product for tied outputs.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// Token (or position) embedding. Parameter: "embedding" (num_embeddings, features).
///  ids (...) i32/i64 in [0, num_embeddings) -> (..., features) f32.
struct Embedding {
  std::int64_t num_embeddings = 0;
  std::int64_t features = 0;
  Initializer embedding_init = normal(0.02);
  /// How the table is split over the mesh (empty = replicated); on a scope bound to a
  /// device the layer looks up in its local shard (vocabulary-parallel lookups live in
  /// parallel/tensor_parallel.hpp).
  mesh::PartitionSpec embedding_spec{};

  Tensor operator()(const Scope& scope, const Tensor& ids) const;
  /// The table itself (created at init if needed), (num_embeddings, features).
  Tensor table(const Scope& scope) const;
  /// Tied output projection, Flax's Embed.attend: x (..., features) -> x @ table^T,
  /// (..., num_embeddings).
  Tensor attend(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
