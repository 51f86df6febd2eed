// ShardedArray: the global view of an array (global shape, dtype, NamedSharding, one
// local shard per device); device_put splits a host tensor, gather rebuilds it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distjax/mesh/named_sharding.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::mesh {

using tensor::Tensor;

/// A global array laid out over a mesh. `shard(d)` is device d's local tensor, of shape
/// `sharding().shard_shape(shape())`. Devices along replicated axes hold equal copies
/// in their own memory. Under a multi-process backend a process holds only the shards
/// of its own devices; the others are undefined tensors (`has_shard(d)` is false).
///
///   Mesh mesh({2, 4}, {"data", "model"});
///   ShardedArray x = device_put(host, NamedSharding(mesh, P("data", "model")));  // (8, 16)
///   x.shard(5).shape();   // (4, 4): rows 4..8, columns 4..8
///   Tensor back = gather(x);
class ShardedArray {
 public:
  ShardedArray() = default;
  /// Checks the spec against `global_shape` and every defined shard's shape and dtype.
  ShardedArray(Shape global_shape, DType dtype, NamedSharding sharding, std::vector<Tensor> shards);

  bool defined() const { return sharding_.has_value(); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const NamedSharding& sharding() const;
  const Mesh& mesh() const { return sharding().mesh(); }
  const PartitionSpec& spec() const { return sharding().spec(); }
  /// Shape of each device's shard.
  Shape shard_shape() const { return sharding().shard_shape(shape_); }
  int num_devices() const { return static_cast<int>(shards_.size()); }
  /// Device `device`'s local shard; throws ShardingError if it is not held here.
  const Tensor& shard(int device) const;
  bool has_shard(int device) const;
  const std::vector<Tensor>& shards() const { return shards_; }

  /// "ShardedArray(f32, (8, 16), P(\"data\", \"model\") on (\"data\"=2, \"model\"=4))".
  std::string str() const;

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  std::optional<NamedSharding> sharding_;
  std::vector<Tensor> shards_;
};

/// Splits `host` into one shard per device of `sharding`'s mesh (each a copy in its own
/// memory, on host's device). `name` names the argument in errors; throws ShardingError
/// when the spec does not fit `host`'s shape.
ShardedArray device_put(const Tensor& host, const NamedSharding& sharding,
                        std::string_view name = "x");
/// Rebuilds the global array from the shards (one device per distinct shard is read), on
/// the shards' device.
Tensor gather(const ShardedArray& array);

}  // namespace distjax::mesh
