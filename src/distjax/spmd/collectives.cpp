// Differentiable named-axis collectives. Each op is one custom_vjp: its forward and its
// transpose (the table in docs/spmd.md) sit side by side, with the cotangent assumption
// stated.
#include "distjax/spmd/collectives.hpp"

#include <string>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/spmd/blocks.hpp"
#include "distjax/spmd/detail/named.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/parallel_ops.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::spmd {

using comm::ReduceOp;
using tensor::Tensor;

namespace {


// Names a CommError after the user-level op and axes (detail/named.hpp).
template <class F>
auto named(const char* op, const Axes& axes, F&& f) {
  return detail::named(op, axes.str(), std::forward<F>(f));
}

void count_call(DeviceContext& ctx, const std::string& name) {
  ++ctx.counters().collective_calls[name];
}

Tensor zeros_like_shape(const Shape& s, DType dt) {
  return Tensor::zeros(s, dt);
}

// ------------------------------------------------------------ raw (non-differentiable)

Tensor raw_all_reduce(comm::Communicator& c, const Tensor& x, ReduceOp op) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  c.all_reduce(comm::buffer_of(x), comm::buffer_of(out), op);
  return out;
}

Tensor raw_all_gather(comm::Communicator& c, const Tensor& x, int dim, bool tiled) {
  const int n = c.size();
  Shape bs = x.shape();
  bs.insert(bs.begin(), n);
  Tensor blocks = Tensor::empty(bs, x.dtype(), x.device());
  c.all_gather(comm::buffer_of(x), comm::buffer_of(blocks));
  return blocks_to_dim(blocks, dim, tiled);
}

Tensor raw_reduce_scatter(comm::Communicator& c, const Tensor& x, int dim, bool tiled) {
  const int n = c.size();
  Tensor send = dim_to_blocks(x, dim, n, tiled);
  Shape out_shape(send.shape().begin() + 1, send.shape().end());
  // Not tiled: the block dimension is gone; tiled: the block keeps dim at size S.
  if (!tiled) {
    out_shape = x.shape();
    out_shape.erase(out_shape.begin() + dim);
  } else {
    out_shape = x.shape();
    out_shape[dim] /= n;
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  c.reduce_scatter(comm::buffer_of(send), comm::buffer_of(out), ReduceOp::Sum);
  return out;
}

Tensor raw_all_to_all(comm::Communicator& c, const Tensor& x, int split_dim, int concat_dim) {
  const int n = c.size();
  Tensor send = dim_to_blocks(x, split_dim, n, /*tiled=*/true);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device());
  c.all_to_all(comm::buffer_of(send), comm::buffer_of(recv));
  return blocks_to_dim(recv, concat_dim, /*tiled=*/true);
}

void check_tiling(const char* op, const Tensor& x, int dim, int n, bool tiled,
                  const DeviceContext& ctx, const Axes& axes) {
  if (tiled) {
    DISTJAX_CHECK(x.size(dim) % n == 0, ShardingError, "[", op, "] dimension ", dim, " (",
                  x.size(dim), ") of ", to_string(x.shape()), " is not divisible by ", axes.str(),
                  "=", n, " in mesh ", ctx.mesh().describe());
  } else {
    DISTJAX_CHECK(x.size(dim) == n, ShardingError, "[", op, "] untiled: dimension ", dim, " (",
                  x.size(dim), ") of ", to_string(x.shape()), " must equal the size of ",
                  axes.str(), "=", n, " in mesh ", ctx.mesh().describe());
  }
}

Tensor with_vma(Tensor t, std::uint32_t mask) {
  t.set_varying_axes(mask);
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------- psum
// Forward: all-reduce sum. Transpose: identity. Assumes the cotangent is equal along
// `axes` (the sum is replicated and the code after it runs identically everywhere).
Tensor psum(DeviceContext& ctx, const Tensor& x_in, const Axes& axes) {
  tensor::check_defined(x_in, "psum", "x");
  comm::Communicator c = ctx.comm(axes);
  const std::uint32_t m = ctx.axis_mask(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  count_call(ctx, "psum");
  return with_vma(autodiff::custom_vjp1(
      "psum", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            named("psum", axes, [&] { return raw_all_reduce(c, in[0], ReduceOp::Sum); })};
      },
      [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
        return std::vector<Tensor>{g[0]};
      },
      tensor::VaryingRule::AsIs), x.varying_axes() & ~m);
}

// ---------------------------------------------------------------------------- pmean
// Forward: all-reduce mean. Transpose: cotangent / n (same assumption as psum).
Tensor pmean(DeviceContext& ctx, const Tensor& x_in, const Axes& axes) {
  tensor::check_defined(x_in, "pmean", "x");
  comm::Communicator c = ctx.comm(axes);
  const std::uint32_t m = ctx.axis_mask(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  const double n = c.size();
  count_call(ctx, "pmean");
  return with_vma(autodiff::custom_vjp1(
      "pmean", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            named("pmean", axes, [&] { return raw_all_reduce(c, in[0], ReduceOp::Mean); })};
      },
      [n](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
        if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
        // f32 division by n: the same bits as dividing in f64 and rounding (double
        // rounding is innocuous for a quotient of f32 values computed in f64).
        tensor::check_dtype(g[0], DType::F32, "pmean transpose", "the cotangent");
        return std::vector<Tensor>{
            tensor::div(g[0].detach(), Tensor::scalar(n, DType::F32, g[0].device()))};
      },
      tensor::VaryingRule::AsIs), x.varying_axes() & ~m);
}

// ---------------------------------------------------------------------------- pmax
// Forward: all-reduce max. Transpose: the cotangent goes, element by element, to the
// device of lowest axis index holding the maximum. Assumes the cotangent is equal along
// `axes`. The owner is found in the forward pass (two more all-reduces, only when the
// input is being differentiated) so the backward needs no communication.
Tensor pmax(DeviceContext& ctx, const Tensor& x_in, const Axes& axes) {
  tensor::check_defined(x_in, "pmax", "x");
  comm::Communicator c = ctx.comm(axes);
  const std::uint32_t vm = ctx.axis_mask(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  const int n = c.size();
  const int me = c.rank();
  const bool want_grad = tensor::needs_grad({&x});
  if (want_grad) tensor::check_dtype(x, DType::F32, "pmax", "x");
  count_call(ctx, "pmax");
  auto mask = std::make_shared<Tensor>();
  return with_vma(autodiff::custom_vjp1(
      "pmax", {x},
      [&](const std::vector<Tensor>& in) {
        return named("pmax", axes, [&] {
          Tensor m = raw_all_reduce(c, in[0], ReduceOp::Max);
          if (want_grad) {
            // owner = n - max over devices holding the max of (n - index).
            const auto mine = static_cast<float>(n - me);
            Tensor cand = tensor::select_equal(in[0], m, mine);
            Tensor owner = raw_all_reduce(c, cand, ReduceOp::Max);
            *mask =
                tensor::select_equal(owner, Tensor::scalar(mine, DType::F32, owner.device()), 1.f);
          }
          return std::vector<Tensor>{m};
        });
      },
      [mask](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
        if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
        tensor::check_dtype(g[0], DType::F32, "pmax transpose", "the cotangent");
        return std::vector<Tensor>{tensor::mul(g[0].detach(), *mask)};
      },
      tensor::VaryingRule::AsIs), x.varying_axes() & ~vm);
}

// ---------------------------------------------------------------------- all_gather
// Forward: all-gather along `dim` (concatenated when tiled, stacked when not).
// Transpose: psum_scatter along `dim` with the same tiling. Assumes each device's
// cotangent is its own contribution to the global objective (they are summed).
Tensor all_gather(DeviceContext& ctx, const Tensor& x_in, const Axes& axes, int dim, bool tiled) {
  tensor::check_defined(x_in, "all_gather", "x");
  comm::Communicator c = ctx.comm(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  dim = normalize_axis(dim, x.rank() + (tiled ? 0 : 1), "all_gather");
  count_call(ctx, "all_gather");
  DeviceContext* pctx = &ctx;
  return with_vma(autodiff::custom_vjp1(
      "all_gather", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            named("all_gather", axes, [&] { return raw_all_gather(c, in[0], dim, tiled); })};
      },
      [c, dim, tiled, axes, pctx](const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                                  const std::vector<Tensor>& g) mutable {
        count_call(*pctx, "all_gather.T");
        Tensor gy = g[0].defined() ? g[0] : zeros_like_shape(out[0].shape(), out[0].dtype());
        return std::vector<Tensor>{named("all_gather transpose (psum_scatter)", axes,
                                         [&] { return raw_reduce_scatter(c, gy, dim, tiled); })};
      },
      tensor::VaryingRule::AsIs), x.varying_axes());
}

// ------------------------------------------------------------ all_gather_invariant
// Forward: all-gather, as all_gather; the result is marked replicated along `axes`.
// Transpose: this device's block of the cotangent (no communication). Assumes the
// cotangent is equal along `axes` (the result is used identically on every device), so
// block i of it is exactly the cotangent of device i's piece.
Tensor all_gather_invariant(DeviceContext& ctx, const Tensor& x_in, const Axes& axes, int dim,
                            bool tiled) {
  tensor::check_defined(x_in, "all_gather_invariant", "x");
  comm::Communicator c = ctx.comm(axes);
  const std::uint32_t m = ctx.axis_mask(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  dim = normalize_axis(dim, x.rank() + (tiled ? 0 : 1), "all_gather_invariant");
  const int me = c.rank();
  const std::int64_t block = tiled ? x.size(dim) : 1;
  count_call(ctx, "all_gather_invariant");
  return with_vma(autodiff::custom_vjp1(
      "all_gather_invariant", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{named("all_gather_invariant", axes,
                                         [&] { return raw_all_gather(c, in[0], dim, tiled); })};
      },
      [dim, tiled, me, block](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                              const std::vector<Tensor>& g) {
        if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
        Tensor mine = tensor::slice(g[0], dim, me * block, (me + 1) * block);
        return std::vector<Tensor>{tiled ? mine : tensor::reshape(mine, in[0].shape())};
      },
      tensor::VaryingRule::AsIs), x.varying_axes() & ~m);
}

// -------------------------------------------------------------------- psum_scatter
// Forward: reduce-scatter (sum) along `dim`. Transpose: all_gather along `dim` with the
// same tiling. Assumes block i's cotangent lives on device i (the result varies).
Tensor psum_scatter(DeviceContext& ctx, const Tensor& x_in, const Axes& axes, int dim,
                    bool tiled) {
  tensor::check_defined(x_in, "psum_scatter", "x");
  comm::Communicator c = ctx.comm(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  dim = normalize_axis(dim, x.rank(), "psum_scatter");
  check_tiling("psum_scatter", x, dim, c.size(), tiled, ctx, axes);
  count_call(ctx, "psum_scatter");
  DeviceContext* pctx = &ctx;
  return with_vma(autodiff::custom_vjp1(
      "psum_scatter", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            named("psum_scatter", axes, [&] { return raw_reduce_scatter(c, in[0], dim, tiled); })};
      },
      [c, dim, tiled, axes, pctx](const std::vector<Tensor>&, const std::vector<Tensor>& out,
                                  const std::vector<Tensor>& g) mutable {
        count_call(*pctx, "psum_scatter.T");
        Tensor gy = g[0].defined() ? g[0] : zeros_like_shape(out[0].shape(), out[0].dtype());
        return std::vector<Tensor>{named("psum_scatter transpose (all_gather)", axes,
                                         [&] { return raw_all_gather(c, gy, dim, tiled); })};
      },
      tensor::VaryingRule::AsIs), x.varying_axes());
}

// ---------------------------------------------------------------------- all_to_all
// Forward: split along split_dim, exchange chunks, concatenate along concat_dim.
// Transpose: all_to_all with the two dimensions swapped. No assumption on the cotangent.
Tensor all_to_all(DeviceContext& ctx, const Tensor& x_in, const Axes& axes, int split_dim,
                  int concat_dim) {
  tensor::check_defined(x_in, "all_to_all", "x");
  comm::Communicator c = ctx.comm(axes);
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose below needs a varying input
  split_dim = normalize_axis(split_dim, x.rank(), "all_to_all");
  concat_dim = normalize_axis(concat_dim, x.rank(), "all_to_all");
  check_tiling("all_to_all", x, split_dim, c.size(), true, ctx, axes);
  count_call(ctx, "all_to_all");
  DeviceContext* pctx = &ctx;
  return with_vma(autodiff::custom_vjp1(
      "all_to_all", {x},
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{named(
            "all_to_all", axes, [&] { return raw_all_to_all(c, in[0], split_dim, concat_dim); })};
      },
      [c, split_dim, concat_dim, axes, pctx](const std::vector<Tensor>&,
                                             const std::vector<Tensor>& out,
                                             const std::vector<Tensor>& g) mutable {
        count_call(*pctx, "all_to_all.T");
        Tensor gy = g[0].defined() ? g[0] : zeros_like_shape(out[0].shape(), out[0].dtype());
        return std::vector<Tensor>{named("all_to_all transpose", axes, [&] {
          return raw_all_to_all(c, gy, concat_dim, split_dim);
        })};
      },
      tensor::VaryingRule::AsIs), x.varying_axes());
}

// --------------------------------------------------------------------------- pvary
// Forward: identity. Transpose: psum over `axes`. Assumes each device's cotangent is its
// own contribution (the region after pvary varies per device and its results are summed).
Tensor pvary(DeviceContext& ctx, const Tensor& x, const Axes& axes) {
  tensor::check_defined(x, "pvary", "x");
  // Only the axes x does not vary over yet enter the sum of the transpose; along the
  // others pvary is the identity both ways.
  const std::uint32_t m = ctx.axis_mask(axes);
  const std::uint32_t added = m & ~x.varying_axes();
  if (added == 0) return x;
  const Axes sum_axes = ctx.axes_of(added);
  comm::Communicator c = ctx.comm(sum_axes);
  count_call(ctx, "pvary");
  DeviceContext* pctx = &ctx;
  return with_vma(autodiff::custom_vjp1(
      "pvary", {x},
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].clone()}; },
      [c, sum_axes, pctx](const std::vector<Tensor>&, const std::vector<Tensor>& out,
                          const std::vector<Tensor>& g) mutable {
        count_call(*pctx, "pvary.T");
        Tensor gy = g[0].defined() ? g[0] : zeros_like_shape(out[0].shape(), out[0].dtype());
        return std::vector<Tensor>{named("pvary transpose (psum)", sum_axes,
                                         [&] { return raw_all_reduce(c, gy, ReduceOp::Sum); })};
      },
      tensor::VaryingRule::AsIs), x.varying_axes() | m);
}

int axis_index(const DeviceContext& ctx, const Axes& axes) {
  return ctx.axis_index(axes);
}
int axis_size(const DeviceContext& ctx, const Axes& axes) {
  return ctx.axis_size(axes);
}

Key fold_rng_over_axis(const DeviceContext& ctx, const Key& key, const Axes& axes) {
  return ctx.fold_rng_over_axis(key, axes);
}

}  // namespace distjax::spmd
