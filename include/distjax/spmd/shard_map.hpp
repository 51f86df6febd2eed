// shard_map: runs a per-device function once per device of a mesh (SPMD) on its local
// shards and assembles the per-device results into ShardedArrays.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "distjax/comm/launch.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/mesh/sharded_array.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {

using mesh::NamedSharding;
using mesh::PartitionSpec;
using mesh::ShardedArray;
using tensor::Tensor;

/// fn(ctx, local inputs) -> local outputs, run once per device.
using ShardMapFn =
    std::function<std::vector<Tensor>(DeviceContext& ctx, const std::vector<Tensor>& locals)>;

/// How shard_map runs the devices.
struct ShardMapOptions {
  comm::Backend backend = comm::Backend::Threads;
  /// The devices' current device (comm::LaunchOptions::device): where their tensors are
  /// made; inputs elsewhere are copied there.
  Device device = default_device();
  /// A collective that does not complete within this time fails on every device.
  std::chrono::milliseconds timeout{30000};
  /// Debug check: every output must really be equal along the mesh axes its out_spec
  /// does not name (exact equality, or within `replicated_tolerance`); throws
  /// ShardingError naming the output, the axis and the devices otherwise. Costs one
  /// all_gather per output and replicated axis.
  bool check_replicated = false;
  double replicated_tolerance = 0.0;
  /// Optional interconnect cost model (threads backend).
  comm::LinkModel link{};
  /// Kernel threads per device; 0 = cores / devices (at least 1).
  int intra_op_threads = 0;
  /// Called on each device with its finished context (e.g. to read comm_stats or
  /// counters); runs on the device's thread.
  std::function<void(DeviceContext&)> on_exit{};
  /// comm::LaunchOptions::check_collectives: under MPI, false is the fast mode (no
  /// per-call check but on small all-reduces, which carry it in their own messages; a
  /// hang is still diagnosed at the timeout from the flight records).
  bool check_collectives = true;
  /// comm::LaunchOptions::error_file: under MPI, where each process keeps its error.
  std::string error_file{};
};

/// A function over global arrays built by shard_map.
class ShardMapped {
 public:
  ShardMapped(Mesh mesh, ShardMapFn fn, std::vector<PartitionSpec> in_specs,
              std::vector<PartitionSpec> out_specs, ShardMapOptions options);

  /// Runs fn on every device. Inputs whose sharding differs from in_specs[i] are
  /// resharded first (gather then device_put; needs every shard in this process).
  /// Each output i gets global shape out_sharding.global_shape(local shape); all devices
  /// must return the same local shapes. Under MPI a process holds its own device's
  /// shards only.
  std::vector<ShardedArray> operator()(const std::vector<ShardedArray>& inputs) const;
  /// Same, from host tensors placed with device_put(host[i], in_specs[i]).
  std::vector<ShardedArray> operator()(const std::vector<Tensor>& host_inputs) const;

  const Mesh& mesh() const { return mesh_; }

 private:
  Mesh mesh_;
  ShardMapFn fn_;
  std::vector<PartitionSpec> in_specs_, out_specs_;
  ShardMapOptions options_;
};

/// JAX's shard_map: `fn` sees local shards (in_specs say how inputs are split), talks to
/// other devices only through the collectives of spmd/collectives.hpp, and returns
/// local outputs (out_specs say how to assemble them). Each local input varies over the
/// mesh axes its in_spec names (Tensor::varying_axes); the varying axes propagate through
/// every op (spmd/collectives.hpp). A mesh axis not named in an out spec is a promise that
/// the output is equal along it: an output that varies over such an axis is a
/// ShardingError naming the output, the axis and the spec (a bookkeeping check, no
/// communication); options.check_replicated additionally compares the values.
///
///   Mesh mesh({2, 4}, {"data", "model"});
///   auto f = shard_map(mesh, [](DeviceContext& ctx, const std::vector<Tensor>& in) {
///     return std::vector<Tensor>{psum(ctx, sum(in[0]), {"data", "model"})};
///   }, {P("data", "model")}, {P()});
///   std::vector<ShardedArray> out = f({device_put(x, NamedSharding(mesh, P("data", "model")))});
ShardMapped shard_map(Mesh mesh, ShardMapFn fn, std::vector<PartitionSpec> in_specs,
                      std::vector<PartitionSpec> out_specs, ShardMapOptions options = {});

}  // namespace distjax::spmd
