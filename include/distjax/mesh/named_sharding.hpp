// NamedSharding: a PartitionSpec bound to a Mesh, and the shard arithmetic it implies
// (local shapes, which slice of a global array each device holds).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distjax/core/shape.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"

namespace distjax::mesh {

/// Validates `spec` for an array of shape `shape` on `mesh`: every axis is in the mesh,
/// no axis is used twice, the spec is no longer than the rank, and each dimension is
/// divisible by the product of its axes' sizes. Throws ShardingError like
///   [device_put] argument "x" with shape (6, 4): spec P("data", "model") is invalid on
///   mesh ("data"=4, "model"=2): dimension 0 (6) is not divisible by "data"=4
void validate_spec(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, const char* op,
                   std::string_view argument);

/// The spec of a parameter stored fully sharded (ZeRO-3 / FSDP) over `axis`: `spec` with
/// `axis` added, as the minor axis, to the largest dimension whose (already split) extent
/// is divisible by the axis size (ties: the last such dimension), as the original
/// toolkit's shard_params does. Returns `spec` unchanged when the parameter has fewer than
/// `min_weight_size` elements, when `spec` already uses `axis`, or when no dimension
/// divides; *dim receives the dimension chosen (-1 when unchanged).
///   // on ("data"=2, "model"=4): extents 1024 and 4096/4 = 1024 tie, the last wins
///   fully_sharded_spec({1024, 4096}, P(None, "model"), mesh, "data", 0)
///     == P(None, {"model", "data"})
///   fully_sharded_spec({4096, 512}, P(), mesh, "data", 0) == P("data", None)
PartitionSpec fully_sharded_spec(const Shape& shape, const PartitionSpec& spec, const Mesh& mesh,
                                 const std::string& axis, std::int64_t min_weight_size,
                                 int* dim = nullptr);

/// A PartitionSpec on a Mesh. The constructor checks what does not depend on an array
/// (axes known, none repeated); `validate` checks an array shape against it.
///
///   NamedSharding s(mesh, P("data", std::nullopt));   // rows split over "data"
///   s.shard_shape({8, 4});                            // {4, 4} on a ("data"=2, ...) mesh
class NamedSharding {
 public:
  NamedSharding(Mesh mesh, PartitionSpec spec);

  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }

  /// validate_spec(mesh(), spec(), shape, op, argument).
  void validate(const Shape& shape, const char* op, std::string_view argument) const;
  /// Shape of each device's shard of a global array of shape `global`.
  Shape shard_shape(const Shape& global) const;
  /// Global shape of an array whose shards have shape `local`.
  Shape global_shape(const Shape& local) const;
  /// For each dimension, the [begin, end) range of the global array device `device` holds.
  std::vector<std::pair<std::int64_t, std::int64_t>> shard_range(const Shape& global,
                                                                 int device) const;
  /// Index of device's shard along dimension `dim` (0 when the dimension is replicated).
  int shard_index(int dim, int device) const;
  /// Number of shards along dimension `dim` (product of its axes' sizes).
  int num_shards(int dim) const;
  /// The mesh axes the array is replicated along (not named in the spec), in mesh order.
  std::vector<std::string> replicated_axes() const;

  /// `NamedSharding(mesh=("data"=2, "model"=4), spec=P("data", None))`.
  std::string to_string() const;
  friend bool operator==(const NamedSharding&, const NamedSharding&) = default;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
};

}  // namespace distjax::mesh
