#include "distjax/global/program.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"

namespace distjax::global {

std::pair<GlobalArray, GlobalTree> value_and_grad(const GlobalLossFn& fn,
                                                  const GlobalTree& params) {
  DISTJAX_CHECK(!params.empty(), InvalidArgument, "[global::value_and_grad] no parameters");
  DeviceContext& ctx = params.begin()->second.ctx();
  tensor::TensorTree leaves = locals_of(params);
  GlobalArray loss;
  auto [value, grads] = autodiff::value_and_grad([&](const tensor::TensorTree& q) {
    GlobalTree gq;
    for (const auto& [path, p] : params)
      gq.emplace(path, GlobalArray(ctx, q.at(path), p.shape(), p.sharding()));
    loss = replicate(fn(gq), "loss");
    return loss.local();
  })(leaves);
  GlobalTree out;
  for (const auto& [path, p] : params)
    out.emplace(path, GlobalArray(ctx, grads.at(path), p.shape(), p.sharding()));
  return {GlobalArray(ctx, value, loss.shape(), loss.sharding()), std::move(out)};
}

GlobalTree wrap_params(DeviceContext& ctx, const tensor::TensorTree& locals,
                       const parallel::ShardingRules& rules) {
  GlobalTree out;
  for (const auto& [path, t] : locals)
    out.emplace(path, GlobalArray::from_local(ctx, t, GlobalSharding{rules.spec_for(path)}));
  return out;
}

tensor::TensorTree locals_of(const GlobalTree& tree) {
  tensor::TensorTree t;
  for (const auto& [path, g] : tree)
    t.set(path, g.local());
  return t;
}

spmd::ShardMapped global_map(Mesh mesh, GlobalFn fn, std::vector<PartitionSpec> in_specs,
                             std::vector<PartitionSpec> out_specs, spmd::ShardMapOptions options) {
  auto body = [fn = std::move(fn), in_specs, out_specs](DeviceContext& ctx,
                                                        const std::vector<Tensor>& locals) {
    std::vector<GlobalArray> in;
    for (std::size_t i = 0; i < locals.size(); ++i)
      in.push_back(GlobalArray::from_local(ctx, locals[i], GlobalSharding{in_specs[i]}));
    std::vector<GlobalArray> out = fn(ctx, in);
    DISTJAX_CHECK(out.size() == out_specs.size(), InvalidArgument, "[global_map] fn returned ",
                  out.size(), " outputs for ", out_specs.size(), " out_specs");
    std::vector<Tensor> res;
    for (std::size_t i = 0; i < out.size(); ++i) {
      GlobalArray r = reshard(out[i], GlobalSharding{out_specs[i]}, "global_map output");
      Tensor t = r.local();
      // Values replicated along an axis but tracked as per-device: make them one value.
      const std::uint32_t extra = t.varying_axes() & ~ctx.axis_mask(out_specs[i]);
      if (extra) t = spmd::pmean(ctx, t, ctx.axes_of(extra));
      res.push_back(t);
    }
    return res;
  };
  return spmd::shard_map(std::move(mesh), std::move(body), std::move(in_specs),
                         std::move(out_specs), std::move(options));
}

}  // namespace distjax::global
