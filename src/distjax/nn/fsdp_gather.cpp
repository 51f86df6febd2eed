#include "distjax/nn/fsdp_gather.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/comm/buffer.hpp"
#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/blocks.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {

namespace {

// The differentiable gather: forward = `value` when given (a finished prefetch), else an
// all_gather now; backward = reduce-scatter of the cotangent / n.
Tensor gather_op(spmd::DeviceContext& ctx, const Tensor& shard, const std::string& axis, int dim,
                 Tensor value) {
  const double inv_n = 1.0 / ctx.axis_size(axis);
  spmd::DeviceContext* c = &ctx;
  Tensor out = autodiff::custom_vjp1(
      "fsdp_gather", {shard},
      [c, axis, dim, value](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            value.defined() ? value : spmd::all_gather(*c, in[0], axis, dim, /*tiled=*/true)};
      },
      [c, axis, dim, inv_n](const std::vector<Tensor>&, const std::vector<Tensor>&,
                            const std::vector<Tensor>& g) {
        if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
        return std::vector<Tensor>{
            tensor::mul_scalar(spmd::psum_scatter(*c, g[0], axis, dim, /*tiled=*/true), inv_n)};
      },
      tensor::VaryingRule::AsIs);
  out.set_varying_axes(shard.varying_axes() | ctx.axis_mask(axis));
  return out;
}

}  // namespace

Tensor gather_fully_sharded(spmd::DeviceContext& ctx, const Tensor& shard, const std::string& axis,
                            int dim) {
  return gather_op(ctx, shard, axis, dim, Tensor());
}

FsdpPrefetcher::FsdpPrefetcher(int depth) : depth_(depth) {
  DISTJAX_CHECK(depth >= 0, InvalidArgument, "[FsdpPrefetcher] depth must be >= 0, got ", depth);
}

FsdpPrefetcher::~FsdpPrefetcher() {
  for (auto& [pos, f] : in_flight_)
    f.request.wait();
}

void FsdpPrefetcher::begin_pass() {
  for (auto& [pos, f] : in_flight_)
    f.request.wait();
  in_flight_.clear();
  if (!current_.empty()) last_ = std::move(current_);
  current_.clear();
}

void FsdpPrefetcher::start(spmd::DeviceContext& ctx, std::size_t position) {
  if (position >= last_.size() || in_flight_.count(position)) return;
  const Entry& e = last_[position];
  InFlight f;
  f.path = e.path;
  f.storage = e.shard.storage();
  f.shape = e.shard.shape();
  comm::Communicator& comm = ctx.comm(e.axis);
  Shape blocks_shape = e.shard.shape();
  blocks_shape.insert(blocks_shape.begin(), comm.size());
  f.blocks = Tensor::empty(blocks_shape, DType::F32, e.shard.device());  // beside the shard
  tensor::check_dtype(e.shard, DType::F32, "fsdp prefetch", "the shard");
  f.request = comm.iall_gather(comm::buffer_of(e.shard), comm::buffer_of(f.blocks));
  in_flight_.emplace(position, std::move(f));
}

Tensor FsdpPrefetcher::gather(spmd::DeviceContext& ctx, const std::string& path,
                              const Tensor& shard, const std::string& axis, int dim) {
  const std::size_t position = current_.size();
  current_.push_back({path, shard, axis, dim});
  Tensor value;
  if (auto it = in_flight_.find(position); it != in_flight_.end()) {
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    f.request.wait();
    if (f.path == path && f.storage == shard.storage() && f.shape == shard.shape() &&
        shard.dtype() == DType::F32) {
      tensor::NoGradGuard no_grad;
      value = spmd::blocks_to_dim(f.blocks, dim, /*tiled=*/true);
    }
  }
  // The next ones travel while this parameter's module computes.
  for (int k = 1; k <= depth_; ++k)
    start(ctx, position + static_cast<std::size_t>(k));
  (value.defined() ? hits_ : misses_) += 1;
  return gather_op(ctx, shard, axis, dim, value);
}

}  // namespace distjax::nn
