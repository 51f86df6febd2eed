// DeviceContext: coordinates and the communicators along every set of mesh axes.
#include "distjax/spmd/device_context.hpp"

#include "distjax/core/error.hpp"

namespace distjax::spmd {

DeviceContext::DeviceContext(Mesh mesh, comm::Communicator world)
    : mesh_(std::move(mesh)), world_(std::move(world)) {
  DISTJAX_CHECK(world_.valid(), InvalidArgument, "[DeviceContext] invalid world communicator");
  DISTJAX_CHECK(world_.size() == mesh_.size(), ShardingError, "[DeviceContext] mesh ",
                mesh_.describe(), " has ", mesh_.size(), " devices but the world has ",
                world_.size());
  device_ = world_.rank();
  coords_ = mesh_.coords(device_);
  // Split once per subset of the axes, in mesh order and the same order on every device,
  // so that later lookups are local. The full set is the world itself, labelled first so
  // that the splits count under it too.
  const int k = mesh_.ndim();
  world_.set_label(comm_label(Axes(mesh_.axis_names())));
  for (int mask = 0; mask < (1 << k); ++mask) {
    std::vector<std::string> axes;
    for (int i = 0; i < k; ++i)
      if (mask & (1 << i)) axes.push_back(mesh_.axis_names()[i]);
    if (mask == (1 << k) - 1) {
      comms_.emplace(axes, world_);
      continue;
    }
    auto c =
        world_.split(mesh_.group_id(device_, Axes(axes)), mesh_.index_along(device_, Axes(axes)));
    c.set_label(comm_label(Axes(axes)));
    comms_.emplace(axes, std::move(c));
  }
}

int DeviceContext::coord(std::string_view axis) const {
  return coords_[mesh_.axis_position(axis, "DeviceContext::coord")];
}

int DeviceContext::axis_index(const Axes& axes) const {
  mesh_.check_axes(axes, "axis_index");
  return mesh_.index_along(device_, axes);
}

int DeviceContext::axis_size(const Axes& axes) const {
  return mesh_.axes_size(axes, "axis_size");
}

comm::Communicator& DeviceContext::comm(const Axes& axes) {
  auto it = comms_.find(axes.names);
  if (it != comms_.end()) return it->second;
  mesh_.check_axes(axes, "DeviceContext::comm");
  // A set of axes in another order than the mesh's: same members, other ranking.
  auto c = world_.split(mesh_.group_id(device_, axes), mesh_.index_along(device_, axes));
  c.set_label(comm_label(axes));
  return comms_.emplace(axes.names, std::move(c)).first->second;
}

std::string DeviceContext::comm_label(const Axes& axes) const {
  mesh_.check_axes(axes, "comm_label");
  std::string label;
  for (const auto& a : axes_of(axis_mask(axes)).names) {
    if (!label.empty()) label.push_back(',');
    label.append(a);
  }
  return label;
}

std::uint32_t DeviceContext::axis_mask(const Axes& axes) const {
  std::uint32_t m = 0;
  for (const auto& a : axes.names)
    m |= 1u << mesh_.axis_position(a, "axis_mask");
  return m;
}

std::uint32_t DeviceContext::axis_mask(const mesh::PartitionSpec& spec) const {
  return axis_mask(Axes(spec.used_axes()));
}

Axes DeviceContext::axes_of(std::uint32_t mask) const {
  std::vector<std::string> names;
  for (int i = 0; i < mesh_.ndim(); ++i)
    if (mask & (1u << i)) names.push_back(mesh_.axis_names()[i]);
  return Axes(std::move(names));
}

tensor::Tensor DeviceContext::psum_mask(const tensor::Tensor& g, std::uint32_t mask) {
  ++counters_.collective_calls["pvary.T"];
  comm::Communicator& c = comm(axes_of(mask));
  tensor::Tensor out = tensor::Tensor::empty(g.shape(), g.dtype(), g.device());
  c.all_reduce(comm::buffer_of(g), comm::buffer_of(out), comm::ReduceOp::Sum);
  out.set_varying_axes(g.varying_axes() & ~mask);
  return out;
}

Key DeviceContext::fold_rng_over_axis(const Key& key, const Axes& axes) const {
  mesh_.check_axes(axes, "fold_rng_over_axis");
  Key k = key;
  for (const auto& a : axes.names)
    k = k.fold_in(static_cast<std::uint64_t>(coord(a)));
  return k;
}

}  // namespace distjax::spmd
