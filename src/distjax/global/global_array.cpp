#include "distjax/global/global_array.hpp"

#include <sstream>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/global/comm_plan.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::global {

namespace detail {

std::uint32_t sharding_mask(const DeviceContext& ctx, const GlobalSharding& s) {
  std::uint32_t m = ctx.axis_mask(s.spec);
  if (!s.partial.empty()) m |= ctx.axis_mask(mesh::Axes(s.partial));
  return m;
}

void record_compute(const DeviceContext& ctx, const char* op, double flops,
                    const GlobalSharding& output) {
  PlanRecorder* plan = current_plan();
  if (plan == nullptr) return;
  const std::uint32_t used = sharding_mask(ctx, output);
  std::vector<std::string> repeated;
  for (const std::string& a : ctx.mesh().axis_names())
    if (ctx.mesh().axis_size(a) > 1 && (ctx.axis_mask(mesh::Axes(a)) & used) == 0)
      repeated.push_back(a);
  plan->add_compute(op, flops, repeated);
}

std::vector<Tensor> join_varying(const char* op, const std::vector<GlobalArray>& xs) {
  std::uint32_t all = 0;
  for (const auto& x : xs)
    all |= x.local().varying_axes();
  std::vector<Tensor> out;
  for (const auto& x : xs) {
    const Tensor& t = x.local();
    const std::uint32_t missing = all & ~t.varying_axes();
    if (missing && t.requires_grad()) {
      // The tape's implicit pvary: identity forward, psum of the cotangent backward.
      DeviceContext& ctx = x.ctx();
      const mesh::Axes axes = ctx.axes_of(missing);
      const std::int64_t n = ctx.axis_size(axes);
      const auto b = static_cast<std::int64_t>(t.nbytes());
      record({op, "all_reduce", ctx.comm_label(axes), 2 * (n - 1) * (b / n),
              PlanEntry::Phase::Backward, "cotangent of " + x.str() + " (implicit pvary)"});
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace detail

namespace {

std::string dtype_str(DType d) {
  return dtype_name(d);
}

// Replicated along `axes` -> this device's block along `dim` (no communication).
// Transpose: all-gather of the blocks' cotangents, replicated along `axes`.
Tensor split_local(DeviceContext& ctx, const Tensor& x, const mesh::Axes& axes, int dim) {
  const std::int64_t n = ctx.axis_size(axes), i = ctx.axis_index(axes);
  const std::int64_t s = x.size(dim) / n;
  const std::uint32_t m = ctx.axis_mask(axes);
  if (x.varying_axes() & m) {
    // Already per-device along some of the axes: each device's cotangent is its share,
    // so the transpose pads with zeros (and sums over the axes pvary adds).
    return tensor::slice(spmd::pvary(ctx, x, axes), dim, i * s, (i + 1) * s);
  }
  DeviceContext* pctx = &ctx;
  Tensor out = autodiff::custom_vjp1(
      "global_split", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{tensor::slice(in[0], dim, i * s, (i + 1) * s)};
      },
      [pctx, axes, dim](const std::vector<Tensor>&, const std::vector<Tensor>&,
                        const std::vector<Tensor>& g) {
        if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
        return std::vector<Tensor>{
            spmd::all_gather_invariant(*pctx, g[0].detach(), axes, dim, /*tiled=*/true)};
      },
      tensor::VaryingRule::AsIs);
  out.set_varying_axes(x.varying_axes() | m);
  return out;
}

// Replicated along `axes` -> partial sums: the value on index 0, zeros elsewhere.
// Transpose: identity (the cotangent of a partial value is equal along its axes).
Tensor to_partial(DeviceContext& ctx, const Tensor& x, const mesh::Axes& axes) {
  const bool keep = ctx.axis_index(axes) == 0;
  Tensor out = autodiff::custom_vjp1(
      "global_to_partial", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{keep ? in[0].clone()
                                        : Tensor::zeros(in[0].shape(), in[0].dtype())};
      },
      [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
        return std::vector<Tensor>{g[0]};
      },
      tensor::VaryingRule::AsIs);
  out.set_varying_axes(x.varying_axes() | ctx.axis_mask(axes));
  return out;
}

}  // namespace

GlobalArray::GlobalArray(DeviceContext& ctx, Tensor local, Shape shape, GlobalSharding sharding)
    : ctx_(&ctx), local_(std::move(local)), shape_(std::move(shape)) {
  tensor::check_defined(local_, "GlobalArray", "local");
  sharding_ = sharding.normalized(static_cast<int>(shape_.size()), ctx.mesh());
  check_sharding(shape_, sharding_, ctx.mesh(), "GlobalArray", "array");
  const Shape want = local_shape(shape_, sharding_, ctx.mesh());
  DISTJAX_CHECK(local_.shape() == want, ShardingError, "[GlobalArray] local block ",
                to_string(local_.shape()), " does not match global shape ", to_string(shape_),
                " with sharding ", sharding_.to_string(), " on mesh ", ctx.mesh().describe(),
                ": expected ", to_string(want));
  const std::uint32_t missing = detail::sharding_mask(ctx, sharding_) & ~local_.varying_axes();
  if (missing) local_ = spmd::pvary(ctx, local_, ctx.axes_of(missing));
}

GlobalArray GlobalArray::from_local(DeviceContext& ctx, Tensor local, GlobalSharding sharding) {
  Shape g = local.shape();
  for (std::size_t d = 0; d < g.size(); ++d)
    for (const auto& a : sharding.spec.entry(static_cast<int>(d)).axes)
      g[d] *= ctx.mesh().axis_size(a);
  return GlobalArray(ctx, std::move(local), std::move(g), std::move(sharding));
}

GlobalArray GlobalArray::from_host(DeviceContext& ctx, const Tensor& host,
                                   GlobalSharding sharding) {
  DISTJAX_CHECK(sharding.partial.empty(), ShardingError,
                "[GlobalArray::from_host] a host array has no partial sums, got ",
                sharding.to_string());
  const GlobalSharding s = sharding.normalized(host.rank(), ctx.mesh());
  check_sharding(host.shape(), s, ctx.mesh(), "GlobalArray::from_host", "host array");
  Tensor t = host.detach();
  for (int d = 0; d < host.rank(); ++d) {
    const auto axes = s.spec.entry(d).axes;
    if (axes.empty()) continue;
    const std::int64_t n = ctx.axis_size(mesh::Axes(axes)), i = ctx.axis_index(mesh::Axes(axes));
    const std::int64_t w = host.size(d) / n;
    t = tensor::slice(t, d, i * w, (i + 1) * w);
  }
  return GlobalArray(ctx, t.clone(), host.shape(), s);
}

GlobalArray GlobalArray::replicated(DeviceContext& ctx, Tensor value) {
  Shape s = value.shape();
  return GlobalArray(ctx, std::move(value), std::move(s), GlobalSharding{});
}

std::int64_t GlobalArray::size(int dim) const {
  const int r = rank();
  if (dim < 0) dim += r;
  DISTJAX_CHECK(dim >= 0 && dim < r, InvalidArgument, "[GlobalArray] dimension ", dim,
                " out of range for rank ", r);
  return shape_[static_cast<std::size_t>(dim)];
}

std::string GlobalArray::str() const {
  std::ostringstream os;
  os << to_string(shape_) << " " << dtype_str(dtype()) << " " << sharding_.to_string();
  return os.str();
}

GlobalArray reshard(const GlobalArray& x, const GlobalSharding& target_in, const char* op,
                    std::uint32_t keep_varying) {
  DeviceContext& ctx = x.ctx();
  const GlobalSharding target = target_in.normalized(x.rank(), ctx.mesh());
  if (x.sharding() == target) return x;
  const auto steps = plan_redistribution(x.shape(), x.sharding(), target, ctx.mesh(),
                                         static_cast<std::int64_t>(dtype_size(x.dtype())));
  const std::string what = x.str() + " -> " + target.to_string();
  Tensor t = x.local();
  using K = RedistStep::Kind;
  using Phase = PlanEntry::Phase;
  for (const auto& s : steps) {
    const mesh::Axes axes(s.axes);
    const std::string label = ctx.comm_label(axes);
    const bool grad = t.requires_grad();
    auto fwd = [&](const char* c) { record({op, c, label, s.bytes, Phase::Forward, what}); };
    auto bwd = [&](const char* c) {
      if (grad) record({op, c, label, s.bytes, Phase::Backward, what});
    };
    switch (s.kind) {
      case K::AllGather:
        fwd("all_gather");
        if ((ctx.axis_mask(axes) & ~keep_varying) == 0) {
          bwd("reduce_scatter");
          t = spmd::all_gather(ctx, t, axes, s.dim, /*tiled=*/true);
        } else {
          t = spmd::all_gather_invariant(ctx, t, axes, s.dim, /*tiled=*/true);
        }
        break;
      case K::AllToAll:
        fwd("all_to_all");
        bwd("all_to_all");
        t = spmd::all_to_all(ctx, t, axes, /*split_dim=*/s.dim, /*concat_dim=*/s.dim2);
        break;
      case K::AllReduce:
        fwd("all_reduce");
        t = spmd::psum(ctx, t, axes);
        break;
      case K::ReduceScatter:
        fwd("reduce_scatter");
        bwd("all_gather");
        t = spmd::psum_scatter(ctx, t, axes, s.dim, /*tiled=*/true);
        break;
      case K::Split: {
        if (grad && !(t.varying_axes() & ctx.axis_mask(axes))) {
          const std::int64_t n = ctx.axis_size(axes);
          record({op, "all_gather", label,
                  (n - 1) * numel(s.local_out) * static_cast<std::int64_t>(dtype_size(t.dtype())),
                  Phase::Backward, what});
        }
        t = split_local(ctx, t, axes, s.dim);
        break;
      }
      case K::ToPartial:
        t = to_partial(ctx, t, axes);
        break;
    }
  }
  return GlobalArray(ctx, t, x.shape(), target);
}

GlobalArray with_sharding_constraint(const GlobalArray& x, const GlobalSharding& target) {
  return reshard(x, target, "with_sharding_constraint");
}

GlobalArray replicate(const GlobalArray& x, const char* op) {
  GlobalArray r = reshard(x, GlobalSharding{}, op);
  Tensor t = r.local();
  if (t.varying_axes() != 0) {
    // Equal along these axes but tracked as per-device: pmean makes it one value.
    DeviceContext& ctx = x.ctx();
    const mesh::Axes axes = ctx.axes_of(t.varying_axes());
    const std::int64_t n = ctx.axis_size(axes);
    record({op, "all_reduce", ctx.comm_label(axes),
            2 * (n - 1) * (static_cast<std::int64_t>(t.nbytes()) / n), PlanEntry::Phase::Forward,
            r.str() + " varying -> invariant"});
    t = spmd::pmean(ctx, t, axes);
  }
  return GlobalArray(x.ctx(), t, x.shape(), GlobalSharding{});
}

std::int64_t reshard_bytes(const GlobalArray& x, const GlobalSharding& target) {
  return redistribution_bytes(x.shape(), x.sharding(), target.normalized(x.rank(), x.mesh()),
                              x.mesh(), static_cast<std::int64_t>(dtype_size(x.dtype())));
}

}  // namespace distjax::global
