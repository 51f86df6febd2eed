// Dropout: inverted dropout driven by the scope's dropout key and train flag.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// Zeroes each element with probability `rate` and scales the rest by 1 / (1 - rate)
/// when scope.train(); the identity otherwise. The mask comes from scope.dropout_key(),
/// so each scope name gets its own mask and a key gives the same mask on every run.
///  x (...) -> (...). No parameters.
struct Dropout {
  float rate = 0.f;
  /// How x is split over the mesh (empty = not split). On a scope with a device context,
  /// each device draws its block of the mask of the whole array, so a sharded run drops
  /// exactly the elements one device would (tensor parallelism's feature- or
  /// sequence-sharded activations).
  mesh::PartitionSpec spec{};
  /// x's sequence dimension (1) as chunks of a longer sequence (context parallelism): x holds
  /// sequence_starts.size() chunks of equal length, starting at these global positions of a
  /// sequence of sequence_length; each draws its block of the whole sequence's mask, so the
  /// split run drops what one device would. Empty: dimension 1 is whole (or split by spec).
  /// Not with a spec that splits dimension 1 (InvalidArgument).
  std::vector<std::int64_t> sequence_starts{};
  std::int64_t sequence_length = 0;

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
