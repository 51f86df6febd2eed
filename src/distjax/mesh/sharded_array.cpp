// ShardedArray, device_put (split a host array) and gather (rebuild it).
#include "distjax/mesh/sharded_array.hpp"

#include <set>

#include "distjax/core/error.hpp"
#include "distjax/tensor/inplace_ops.hpp"

namespace distjax::mesh {

namespace {

std::vector<std::int64_t> offsets_of(const NamedSharding& s, const Shape& global, int device) {
  std::vector<std::int64_t> off;
  for (const auto& [b, e] : s.shard_range(global, device))
    off.push_back(b);
  return off;
}

}  // namespace

ShardedArray::ShardedArray(Shape global_shape, DType dtype, NamedSharding sharding,
                           std::vector<Tensor> shards)
    : shape_(std::move(global_shape)),
      dtype_(dtype),
      sharding_(std::move(sharding)),
      shards_(std::move(shards)) {
  sharding_->validate(shape_, "ShardedArray", "array");
  DISTJAX_CHECK(static_cast<int>(shards_.size()) == sharding_->mesh().size(), ShardingError,
                "[ShardedArray] ", shards_.size(), " shards for mesh ",
                sharding_->mesh().describe(), " of ", sharding_->mesh().size(), " devices");
  const Shape local = sharding_->shard_shape(shape_);
  for (std::size_t d = 0; d < shards_.size(); ++d) {
    if (!shards_[d].defined()) continue;
    DISTJAX_CHECK(shards_[d].shape() == local && shards_[d].dtype() == dtype_, ShardingError,
                  "[ShardedArray] shard of device ", d, " is ", dtype_name(shards_[d].dtype()), " ",
                  to_string(shards_[d].shape()), " but global ", dtype_name(dtype_), " ",
                  to_string(shape_), " with spec ", sharding_->spec().to_string(), " on mesh ",
                  sharding_->mesh().describe(), " needs ", to_string(local));
  }
}

const NamedSharding& ShardedArray::sharding() const {
  DISTJAX_CHECK(sharding_.has_value(), ShardingError, "[ShardedArray] undefined array");
  return *sharding_;
}

bool ShardedArray::has_shard(int device) const {
  return device >= 0 && device < num_devices() && shards_[device].defined();
}

const Tensor& ShardedArray::shard(int device) const {
  DISTJAX_CHECK(device >= 0 && device < num_devices(), ShardingError,
                "[ShardedArray::shard] device ", device, " is not in mesh ", mesh().describe());
  DISTJAX_CHECK(shards_[device].defined(), ShardingError,
                "[ShardedArray::shard] the shard of device ", device,
                " is not held by this process");
  return shards_[device];
}

std::string ShardedArray::str() const {
  if (!defined()) return "ShardedArray(undefined)";
  return std::string("ShardedArray(") + dtype_name(dtype_) + ", " + to_string(shape_) + ", " +
         spec().to_string() + " on " + mesh().describe() + ")";
}

ShardedArray device_put(const Tensor& host, const NamedSharding& sharding, std::string_view name) {
  DISTJAX_CHECK(host.defined(), ShardingError, "[device_put] argument \"", name, "\" is undefined");
  sharding.validate(host.shape(), "device_put", name);
  const Shape local = sharding.shard_shape(host.shape());
  std::vector<Tensor> shards;
  shards.reserve(sharding.mesh().size());
  for (int d = 0; d < sharding.mesh().size(); ++d) {
    Tensor t = Tensor::empty(local, host.dtype(), host.device());
    tensor::copy_from_box(t, host, offsets_of(sharding, host.shape(), d));
    shards.push_back(std::move(t));
  }
  return ShardedArray(host.shape(), host.dtype(), sharding, std::move(shards));
}

Tensor gather(const ShardedArray& array) {
  const NamedSharding& s = array.sharding();
  // On the device of the shards held here (the current device when none is).
  Device device = current_device();
  for (int d = 0; d < array.num_devices(); ++d)
    if (array.has_shard(d)) {
      device = array.shard(d).device();
      break;
    }
  Tensor out = Tensor::empty(array.shape(), array.dtype(), device);
  std::set<std::vector<std::int64_t>> done;
  for (int d = 0; d < array.num_devices(); ++d) {
    std::vector<std::int64_t> off = offsets_of(s, array.shape(), d);
    if (done.count(off)) continue;
    if (!array.has_shard(d)) continue;  // another replica may hold the same block
    tensor::copy_to_box(out, off, array.shard(d));
    done.insert(off);
  }
  // Every block must have been found on some device held here.
  std::int64_t blocks = 1;
  for (int d = 0; d < static_cast<int>(array.shape().size()); ++d)
    blocks *= s.num_shards(d);
  DISTJAX_CHECK(static_cast<std::int64_t>(done.size()) == blocks, ShardingError, "[gather] ",
                array.str(), ": only ", done.size(), " of ", blocks,
                " blocks are held by this process (multi-process arrays gather with a collective)");
  return out;
}

}  // namespace distjax::mesh
