// shard_map: input placement, one launch of the per-device function, the replication
// check, and assembly of the outputs.
#include "distjax/spmd/shard_map.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::spmd {

namespace {

std::string arg_name(const char* kind, std::size_t i) {
  return std::string(kind) + std::to_string(i);
}

// Debug check (ShardMapOptions::check_replicated): output `out` must be equal on every
// device of each mesh axis its spec does not name. Every device of a group sees the same
// gathered data, so all of them raise the same error.
void check_replicated_output(DeviceContext& ctx, const Tensor& out, std::size_t index,
                             const PartitionSpec& spec, double tol) {
  for (const auto& axis : ctx.mesh().axis_names()) {
    if (spec.uses(axis) || ctx.mesh().axis_size(axis) == 1) continue;
    comm::Communicator& c = ctx.comm(axis);
    const int n = c.size();
    constexpr int kDesc = 10;  // rank, dtype, up to 8 dimensions
    std::vector<std::int64_t> desc(kDesc, -1), all(kDesc * n);
    desc[0] = out.rank();
    desc[1] = static_cast<std::int64_t>(out.dtype());
    for (int d = 0; d < out.rank() && d < kDesc - 2; ++d)
      desc[2 + d] = out.size(d);
    c.all_gather(desc.data(), all.data(), kDesc, DType::I64);
    for (int r = 1; r < n; ++r)
      DISTJAX_CHECK(std::equal(all.begin(), all.begin() + kDesc, all.begin() + r * kDesc),
                    ShardingError, "[shard_map] output ", index, " with out_spec ",
                    spec.to_string(), " is declared replicated along \"", axis,
                    "\" but its shape/dtype differs between devices ", c.group()[0], " and ",
                    c.group()[r], " in mesh ", ctx.mesh().describe());
    // Gathered on the device, compared on a host copy (a debug check's host decision).
    const std::size_t nb = out.nbytes();
    const Tensor gathered = Tensor::empty({n * out.numel()}, out.dtype(), out.device());
    c.all_gather(comm::buffer_of(out), comm::buffer_of(gathered));
    const Tensor host = gathered.to(Device::cpu());
    const char* buf = static_cast<const char*>(host.raw_data());
    for (int r = 1; r < n; ++r) {
      const char* a = buf;
      const char* b = buf + r * nb;
      if (out.dtype() == DType::F32) {
        const float* fa = reinterpret_cast<const float*>(a);
        const float* fb = reinterpret_cast<const float*>(b);
        double worst = 0;
        std::int64_t at = -1;
        for (std::int64_t i = 0; i < out.numel(); ++i) {
          const double diff = std::fabs(static_cast<double>(fa[i]) - fb[i]);
          if (diff > worst || (std::isnan(diff) && at < 0)) {
            worst = diff;
            at = i;
          }
        }
        DISTJAX_CHECK(at < 0 || worst <= tol, ShardingError, "[shard_map] output ", index,
                      " with out_spec ", spec.to_string(), " is declared replicated along \"", axis,
                      "\" but differs between devices ", c.group()[0], " and ", c.group()[r],
                      " (max |diff| ", worst, " at element ", at, ") in mesh ",
                      ctx.mesh().describe());
      } else {
        DISTJAX_CHECK(std::memcmp(a, b, nb) == 0, ShardingError, "[shard_map] output ", index,
                      " with out_spec ", spec.to_string(), " is declared replicated along \"", axis,
                      "\" but differs between devices ", c.group()[0], " and ", c.group()[r],
                      " in mesh ", ctx.mesh().describe());
      }
    }
  }
}

// An output may vary only over the mesh axes its out_spec names (a free check: the
// varying axes are tracked on every tensor). Same verdict on every device of an SPMD
// program, so all of them raise the same error.
void check_output_varying(const DeviceContext& ctx, const Tensor& out, std::size_t index,
                          const PartitionSpec& spec) {
  const std::uint32_t extra = out.varying_axes() & ~ctx.axis_mask(spec);
  if (extra == 0) return;
  const Axes axes = ctx.axes_of(extra);
  throw ShardingError(
      "[shard_map] output " + std::to_string(index) + " varies over mesh axis " + axes.str() +
      " but its out_spec " + spec.to_string() + " does not name it (mesh " +
      ctx.mesh().describe() +
      "): reduce it over that axis (psum/pmean, all_gather_invariant) or name the axis in the "
      "out_spec");
}

}  // namespace

ShardMapped::ShardMapped(Mesh mesh, ShardMapFn fn, std::vector<PartitionSpec> in_specs,
                         std::vector<PartitionSpec> out_specs, ShardMapOptions options)
    : mesh_(std::move(mesh)),
      fn_(std::move(fn)),
      in_specs_(std::move(in_specs)),
      out_specs_(std::move(out_specs)),
      options_(std::move(options)) {
  DISTJAX_CHECK(fn_ != nullptr, InvalidArgument, "[shard_map] fn is empty");
  // Axis checks that need no shapes (unknown / repeated axes) fail here already.
  for (std::size_t i = 0; i < in_specs_.size(); ++i)
    NamedSharding(mesh_, in_specs_[i]);
  for (std::size_t i = 0; i < out_specs_.size(); ++i)
    NamedSharding(mesh_, out_specs_[i]);
}

std::vector<ShardedArray> ShardMapped::operator()(const std::vector<Tensor>& host_inputs) const {
  DISTJAX_CHECK(host_inputs.size() == in_specs_.size(), ShardingError, "[shard_map] ",
                in_specs_.size(), " in_specs but ", host_inputs.size(), " inputs");
  std::vector<ShardedArray> placed;
  for (std::size_t i = 0; i < host_inputs.size(); ++i)
    placed.push_back(
        mesh::device_put(host_inputs[i], NamedSharding(mesh_, in_specs_[i]), arg_name("in", i)));
  return (*this)(placed);
}

std::vector<ShardedArray> ShardMapped::operator()(const std::vector<ShardedArray>& inputs) const {
  DISTJAX_CHECK(inputs.size() == in_specs_.size(), ShardingError, "[shard_map] ", in_specs_.size(),
                " in_specs but ", inputs.size(), " inputs");
  std::vector<ShardedArray> placed;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    NamedSharding want(mesh_, in_specs_[i]);
    want.validate(inputs[i].shape(), "shard_map", arg_name("in", i));
    if (inputs[i].sharding() == want)
      placed.push_back(inputs[i]);
    else  // reshard through the host
      placed.push_back(mesh::device_put(mesh::gather(inputs[i]), want, arg_name("in", i)));
  }

  std::vector<std::vector<Tensor>> results(mesh_.size());
  comm::LaunchOptions lo;
  lo.backend = options_.backend;
  lo.device = options_.device;
  lo.num_devices = mesh_.size();
  lo.timeout = options_.timeout;
  lo.link = options_.link;
  lo.intra_op_threads = options_.intra_op_threads;
  lo.check_collectives = options_.check_collectives;
  lo.error_file = options_.error_file;
  comm::launch(lo, [&](comm::Communicator& world) {
    DeviceContext ctx(mesh_, world);
    tensor::VaryingAxesHookGuard hook(&ctx);  // the tape's implicit pvary sums through ctx
    const int d = ctx.device();
    std::vector<Tensor> locals;
    for (std::size_t i = 0; i < placed.size(); ++i) {
      Tensor t = placed[i].shard(d).to(options_.device);
      t.set_varying_axes(ctx.axis_mask(in_specs_[i]));  // inputs vary over their in_spec's axes
      locals.push_back(std::move(t));
    }
    std::vector<Tensor> outs = fn_(ctx, locals);
    DISTJAX_CHECK(outs.size() == out_specs_.size(), ShardingError, "[shard_map] fn returned ",
                  outs.size(), " outputs on device ", d, " but there are ", out_specs_.size(),
                  " out_specs");
    for (std::size_t i = 0; i < outs.size(); ++i) {
      DISTJAX_CHECK(outs[i].defined(), ShardingError, "[shard_map] output ", i,
                    " is undefined on device ", d);
      DISTJAX_CHECK(out_specs_[i].size() <= outs[i].rank(), ShardingError, "[shard_map] output ", i,
                    " has local shape ", to_string(outs[i].shape()), " but out_spec ",
                    out_specs_[i].to_string(), " has ", out_specs_[i].size(), " entries");
      check_output_varying(ctx, outs[i], i, out_specs_[i]);
      outs[i] = outs[i].detach();  // the device's tape ends with its thread
      outs[i].set_varying_axes(0);
    }
    if (options_.check_replicated)
      for (std::size_t i = 0; i < outs.size(); ++i)
        check_replicated_output(ctx, outs[i], i, out_specs_[i], options_.replicated_tolerance);
    if (options_.on_exit) options_.on_exit(ctx);
    results[d] = std::move(outs);
  });

  // Assemble: every device held here must agree on local shapes and dtypes.
  int first = -1;
  for (int d = 0; d < mesh_.size() && first < 0; ++d)
    if (!results[d].empty() || out_specs_.empty()) first = d;
  std::vector<ShardedArray> out;
  if (first < 0) return out;
  for (std::size_t i = 0; i < out_specs_.size(); ++i) {
    const Tensor& ref = results[first][i];
    std::vector<Tensor> shards(mesh_.size());
    for (int d = 0; d < mesh_.size(); ++d) {
      if (results[d].empty()) continue;
      const Tensor& t = results[d][i];
      DISTJAX_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype(), ShardingError,
                    "[shard_map] output ", i, " is ", dtype_name(t.dtype()), " ",
                    to_string(t.shape()), " on device ", d, " but ", dtype_name(ref.dtype()), " ",
                    to_string(ref.shape()), " on device ", first,
                    "; every device must return the same local shape");
      shards[d] = t;
    }
    NamedSharding s(mesh_, out_specs_[i]);
    out.emplace_back(s.global_shape(ref.shape()), ref.dtype(), s, std::move(shards));
  }
  return out;
}

ShardMapped shard_map(Mesh mesh, ShardMapFn fn, std::vector<PartitionSpec> in_specs,
                      std::vector<PartitionSpec> out_specs, ShardMapOptions options) {
  return ShardMapped(std::move(mesh), std::move(fn), std::move(in_specs), std::move(out_specs),
                     std::move(options));
}

}  // namespace distjax::spmd
