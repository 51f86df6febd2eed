// GlobalSharding: how a global-view array is laid out on a mesh, per mesh axis one of
// DTensor's placements: Shard(dim) (a PartitionSpec entry names the axis), Replicate (no
// entry names it) or Partial(sum) (the axis is in `partial`: each device holds a partial
// sum and the value is the sum over the axis).
#pragma once

#include <string>
#include <vector>

#include "distjax/core/shape.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"

namespace distjax::global {

using mesh::Mesh;
using mesh::P;
using mesh::PartitionSpec;

/// A PartitionSpec plus the mesh axes along which the array holds partial sums.
/// A mesh axis is in at most one place: one spec entry, or `partial`, or nowhere
/// (replicated).
///
///   GlobalSharding{P("data", std::nullopt)}                 // rows over data
///   GlobalSharding{P("data", std::nullopt), {"model"}}      // ... and partial over model
///   GlobalSharding::replicated()                             // P()
struct GlobalSharding {
  PartitionSpec spec{};
  /// Axes with pending partial sums, kept in mesh order by normalized().
  std::vector<std::string> partial{};

  static GlobalSharding replicated() { return {}; }
  /// The axes entry of dimension `dim` (empty: not split).
  std::vector<std::string> dim_axes(int dim) const { return spec.entry(dim).axes; }
  /// Whether `axis` splits a dimension or is partial.
  bool uses(const std::string& axis) const;
  bool is_partial(const std::string& axis) const;
  bool has_partial() const { return !partial.empty(); }
  /// The spec padded / trimmed to `rank` entries (trailing replicated entries dropped)
  /// and `partial` sorted in mesh order: two equal layouts compare equal after this.
  GlobalSharding normalized(int rank, const Mesh& mesh) const;
  /// `P("data", None)` or `P("data", None) partial("model")`.
  std::string to_string() const;
  friend bool operator==(const GlobalSharding&, const GlobalSharding&) = default;
};

/// Throws ShardingError "[op] <what> with shape (..): sharding ... is invalid on mesh ..."
/// unless every axis is known, used once, and every split dimension divisible.
void check_sharding(const Shape& shape, const GlobalSharding& s, const Mesh& mesh, const char* op,
                    const std::string& what);

/// Whether check_sharding would pass (for rules that try candidates).
bool is_valid_sharding(const Shape& shape, const GlobalSharding& s, const Mesh& mesh);

/// The local shape of a device's block: shape[d] / (product of dim d's axes).
Shape local_shape(const Shape& global, const GlobalSharding& s, const Mesh& mesh);

/// The spec entry of each of `rank` dimensions (empty = replicated).
std::vector<std::vector<std::string>> dim_entries(const GlobalSharding& s, int rank);

/// A sharding from per-dimension entries and partial axes (normalized on `mesh`).
GlobalSharding make_sharding(const std::vector<std::vector<std::string>>& dims,
                             std::vector<std::string> partial, const Mesh& mesh);

}  // namespace distjax::global
