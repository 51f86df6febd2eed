// DeviceContext: what per-device (SPMD) code knows about where it runs: its device
// index and mesh coordinates, one communicator per mesh axis and per set of axes, rng
// helpers and counters. shard_map passes it to the user function; nothing is global.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "distjax/comm/communicator.hpp"
#include "distjax/core/memory_stats.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::spmd {

using mesh::Axes;
using mesh::Mesh;

/// Per-device counters kept by the spmd layer (communication bytes per collective kind
/// and per group of mesh axes are in comm_stats(), kept by the communicator).
struct DeviceCounters {
  /// Forward and backward calls of each differentiable collective, by name ("psum",
  /// "all_gather", "all_gather.T" for a transpose run in the backward pass, ...).
  std::map<std::string, std::int64_t> collective_calls;
  /// (query, key) pairs the blockwise attention of context parallelism computed on this
  /// device, forward (AttentionPart::pairs): its attention work, 4 D flops each.
  std::int64_t attention_pairs = 0;
};

/// One device's view of the mesh inside shard_map. Built collectively by every device
/// of `world` (it splits the world into the groups along every set of mesh axes, in
/// mesh order, so no later lookup needs a collective in mesh order). Each communicator
/// is labelled with comm_label() of its axes, the world too (it is the group along all
/// axes: "data,model"), so comm_stats() counts communication per mesh axis.
///
///   shard_map(mesh, [](DeviceContext& ctx, const std::vector<Tensor>& in) {
///     int i = ctx.axis_index("model");              // 0..3 on a ("data"=2, "model"=4) mesh
///     Tensor s = psum(ctx, in[0], "data");          // over the 2 devices of my column
///     Key k = ctx.fold_rng_over_axis(key, "data");  // differs along data, equal along model
///     ...
///   }, ...);
class DeviceContext final : public tensor::VaryingAxesHook {
 public:
  /// Collective over `world`, whose size must equal mesh.size(); world rank = device.
  DeviceContext(Mesh mesh, comm::Communicator world);

  const Mesh& mesh() const { return mesh_; }
  /// This device's index in the mesh (row-major over the axes).
  int device() const { return device_; }
  /// Coordinates of this device, one per mesh axis.
  const std::vector<int>& coords() const { return coords_; }
  /// Coordinate along one axis; throws ShardingError for an unknown axis.
  int coord(std::string_view axis) const;
  /// Index of this device within its group along `axes` (row-major over `axes` in the
  /// order given); JAX's axis_index.
  int axis_index(const Axes& axes) const;
  /// Number of devices along `axes` (product of their sizes).
  int axis_size(const Axes& axes) const;

  /// The communicator over all devices (rank = device()).
  comm::Communicator& world() { return world_; }
  /// The communicator over this device's group along `axes`: the devices that differ
  /// from this one only in the coordinates of `axes`, ranked by axis_index(axes). The
  /// empty set gives a group of this device alone. A set in an order other than the
  /// mesh's is split on first use (a collective: every device must ask for it in the
  /// same order, as SPMD code does).
  comm::Communicator& comm(const Axes& axes);
  /// The label under which comm(axes) counts its calls in comm_stats(): the axes in mesh
  /// order joined by ',' ("model", "data,model"; "" for the empty set), so ("model",
  /// "data") and ("data", "model") count together. Throws ShardingError for an unknown
  /// axis.
  std::string comm_label(const Axes& axes) const;

  /// `key` with this device's index along each axis of `axes` folded in, one axis after
  /// another: keys differ between devices that differ along `axes` and are equal along
  /// every other axis (sharded init, dropout per data shard).
  Key fold_rng_over_axis(const Key& key, const Axes& axes) const;

  /// The varying-axes mask (Tensor::varying_axes) of `axes`: bit i for mesh axis i.
  std::uint32_t axis_mask(const Axes& axes) const;
  /// The mask of the mesh axes `spec` names.
  std::uint32_t axis_mask(const mesh::PartitionSpec& spec) const;
  /// The axes of a mask, in mesh order.
  Axes axes_of(std::uint32_t mask) const;
  /// The axes `t` varies over, in mesh order (JAX's `vma`).
  Axes varying_axes(const tensor::Tensor& t) const { return axes_of(t.varying_axes()); }

  /// VaryingAxesHook: the sum of a cotangent over the axes of `mask` (the transpose of an
  /// implicit pvary); counted as "pvary.T" in counters().
  tensor::Tensor psum_mask(const tensor::Tensor& g, std::uint32_t mask) override;

  /// The communicator's counters of this device (bytes and calls per kind, timings), in
  /// total and per group of mesh axes (labels from comm_label()). A psum of N f32 over
  /// "model" (size p) adds 2(p-1)/p*4N bytes to both of:
  ///   ctx.comm_stats()[comm::OpKind::AllReduce].bytes_sent;
  ///   ctx.comm_stats().of("model", comm::OpKind::AllReduce).bytes_sent;
  comm::CommStats& comm_stats() { return world_.stats(); }
  DeviceCounters& counters() { return counters_; }
  /// The bytes this device holds by category, as their owners report them (the train
  /// step through its strategy). Zero until a step ran.
  MemoryStats& memory() { return memory_; }

 private:
  Mesh mesh_;
  comm::Communicator world_;
  int device_ = 0;
  std::vector<int> coords_;
  std::map<std::vector<std::string>, comm::Communicator> comms_;
  DeviceCounters counters_;
  MemoryStats memory_;
};

}  // namespace distjax::spmd
