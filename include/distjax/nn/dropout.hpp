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

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
