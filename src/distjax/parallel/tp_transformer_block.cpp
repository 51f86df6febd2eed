#include "distjax/parallel/tp_transformer_block.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/remat.hpp"
#include "distjax/nn/transformer_block.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/parallel/tp_async_dense.hpp"
#include "distjax/parallel/tp_blocks.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

// x + attn(ln1(x)), then + mlp(ln2(x)); the norms on the residual stream's layout
// (LayerNorm on whole or T-split rows, TPNorm on split features), dropout drawing each
// device's block of the single-device mask.
Tensor TPTransformerBlock::sequential(const nn::Scope& scope, const Tensor& x) const {
  const TPProjections proj{.axis = axis,
                           .layout = layout,
                           .sequence_parallel = sequence_parallel,
                           .bidirectional = bidirectional};
  const bool features_sharded = layout == TPLayout::Gather || layout == TPLayout::Async;
  // By value: a rematerialised sub-module calls it again in backward.
  auto ln = [features_sharded, eps = ln_eps, axis = axis](const nn::Scope& s, const Tensor& h) {
    if (features_sharded)
      return TPNorm{.kind = TPNorm::Kind::Layer, .eps = eps, .axis = axis}(s, h);
    return nn::LayerNorm{.eps = eps}(s, h);
  };
  const nn::Dropout drop = context_dropout(
      {.rate = dropout,
       .spec = features_sharded    ? mesh::P(std::nullopt, std::nullopt, axis)
               : sequence_parallel ? mesh::P(std::nullopt, axis)
                                   : mesh::PartitionSpec()},
      scope.context(), context, x.size(1));
  const TPMultiHeadAttention attn{.num_heads = num_heads,
                                  .causal = causal,
                                  .proj = proj,
                                  .kernel_init = kernel_init,
                                  .out_init = out_init,
                                  .segments = segments,
                                  .context = context};
  const TPMLPBlock mlp{
      .hidden = mlp_hidden, .proj = proj, .kernel_init = kernel_init, .out_init = out_init};
  Tensor h =
      nn::remat_call(remat_attn, scope, x, [ln_v = ln, attn](const nn::Scope& s, const Tensor& in) {
        return attn(s.child("attn").module("Attn"), ln_v(s.child("ln1"), in));
      });
  Tensor y = tensor::add(x, drop(scope.child("attn_dropout"), h));
  if (moe) {
    // Per token, so on whatever tokens the stream holds here: all of them, replicated over
    // the model axis (each device runs the experts alike), or this device's share of the
    // sequence (sequence parallelism, a context split); the experts' parameters are
    // replicated over those axes. With the experts split over the model axis
    // (nn::MoE::tensor_axis) the layer gathers a sequence split over it first.
    nn::MoE layer = *moe;
    if (layout == TPLayout::Megatron && sequence_parallel) layer.sequence_axis = axis;
    h = nn::remat_call(remat_mlp, scope, y,
                       [ln_v = ln, moe = layer, features_sharded, axis = axis](const nn::Scope& s,
                                                                               const Tensor& in) {
                         Tensor t = ln_v(s.child("ln2"), in);
                         const nn::Scope m = s.child("moe").module("MLP");
                         // A stream of split features (the gather and async layouts): the layer
                         // needs its tokens' whole features, gathered replicated over the axis (as
                         // the megatron layout's stream is), and each device keeps its block of the
                         // output's features.
                         if (!features_sharded || s.context() == nullptr || s.axis_size(axis) == 1)
                           return moe(m, t);
                         t = spmd::all_gather_invariant(*s.context(), t, axis, 2, /*tiled=*/true);
                         return split_to_sp_region(s.context(), moe(m, t), axis, 2);
                       });
  } else {
    h = nn::remat_call(remat_mlp, scope, y, [ln_v = ln, mlp](const nn::Scope& s, const Tensor& in) {
      return mlp(s.child("mlp").module("MLP"), ln_v(s.child("ln2"), in));
    });
  }
  return tensor::add(y, drop(scope.child("mlp_dropout"), h));
}

// The parallel block: one norm, one fused projection in (qkv | fc1 columns), local heads
// and activation side by side, one fused projection out (out ; fc2 rows).
Tensor TPTransformerBlock::parallel_block(const nn::Scope& scope, const Tensor& x) const {
  using mesh::P;
  const bool tp = layout != TPLayout::None;
  const bool features_sharded = layout == TPLayout::Gather || layout == TPLayout::Async;
  spmd::DeviceContext* ctx = tp ? scope.context() : nullptr;
  const int n = tp ? scope.axis_size(axis) : 1;
  const bool comm = ctx != nullptr && n > 1;
  const std::int64_t c = features_sharded ? x.size(2) * n : x.size(2);
  const std::int64_t hidden = mlp_hidden > 0 ? mlp_hidden : 4 * c;
  const mesh::PartitionSpec cols = tp ? P(std::nullopt, axis) : P();
  const mesh::PartitionSpec rows = tp ? P(axis, std::nullopt) : P();
  const mesh::PartitionSpec vec = tp ? P(axis) : P();
  const mesh::PartitionSpec out_bias = features_sharded ? vec : P();
  const nn::Scope attn_s = scope.child("attn").module("Attn"),
                  mlp_s = scope.child("mlp").module("MLP");
  const nn::Scope qkv = attn_s.child("qkv"), out = attn_s.child("out");
  const nn::Scope fc1 = mlp_s.child("fc1"), fc2 = mlp_s.child("fc2");
  const Tensor w_in = tensor::concat({qkv.param("kernel", {c, 3 * c}, kernel_init, cols),
                                      fc1.param("kernel", {c, hidden}, kernel_init, cols)},
                                     1);  // (C, (3C + H)/n)
  const Tensor b_in = tensor::concat(
      {qkv.param("bias", {3 * c}, nn::zeros(), vec), fc1.param("bias", {hidden}, nn::zeros(), vec)},
      0);
  const Tensor w_out = tensor::concat({out.param("kernel", {c, c}, out_init, rows),
                                       fc2.param("kernel", {hidden, c}, out_init, rows)},
                                      0);  // ((C + H)/n, C)
  const Tensor b_out = tensor::add(out.param("bias", {c}, nn::zeros(), out_bias),
                                   fc2.param("bias", {c}, nn::zeros(), out_bias));

  Tensor h = features_sharded ? TPNorm{.kind = TPNorm::Kind::Layer, .eps = ln_eps, .axis = axis}(
                                    scope.child("ln1"), x)
                              : nn::LayerNorm{.eps = ln_eps}(scope.child("ln1"), x);
  Tensor y;  // (B, T, (3C + H)/n)
  if (layout == TPLayout::Async && comm) {
    y = tensor::add(all_gather_matmul(*ctx, h, w_in, axis, bidirectional), b_in);
  } else {
    if (features_sharded && comm)
      h = spmd::all_gather(*ctx, h, axis, 2, /*tiled=*/true);
    else if (sequence_parallel)
      h = gather_from_sp_region(ctx, h, axis, 1);
    else
      h = copy_to_tp_region(ctx, h, axis);
    y = nn::linear(scope.precision(), h, w_in, b_in);
  }
  const std::vector<Tensor> parts = tensor::split(y, {3 * c / n, hidden / n}, 2);
  const Tensor attn =
      context.active()
          ? context_attention_packed(*scope.context(), parts[0], num_heads / n, causal, context)
          : tensor::attention_packed(parts[0], num_heads / n, causal, 0.f,
                                     scope.precision().compute_dtype, DType::F32, segments);
  const Tensor cat =
      tensor::concat({attn,                                           // (B, T, C/n)
                      tensor::gelu(parts[1], /*approximate=*/true)},  // (B, T, H/n)
                     2);
  Tensor o;
  if (layout == TPLayout::Async && comm) {
    o = matmul_reduce_scatter(*ctx, cat, w_out, axis, bidirectional);
  } else if (features_sharded) {
    o = nn::linear(scope.precision(), cat, w_out);
    if (comm) o = spmd::psum_scatter(*ctx, o, axis, 2, /*tiled=*/true);
  } else if (sequence_parallel) {
    o = reduce_scatter_to_sp_region(ctx, nn::linear(scope.precision(), cat, w_out), axis, 1);
  } else {
    o = reduce_from_tp_region(ctx, nn::linear(scope.precision(), cat, w_out), axis);
  }
  const mesh::PartitionSpec x_spec = features_sharded    ? P(std::nullopt, std::nullopt, axis)
                                     : sequence_parallel ? P(std::nullopt, axis)
                                                         : mesh::PartitionSpec();
  const nn::Dropout drop = context_dropout(
      {.rate = dropout, .spec = tp ? x_spec : mesh::PartitionSpec()}, scope.context(), context,
      x.size(1));
  return tensor::add(x, drop(scope.child("dropout"), tensor::add(o, b_out)));
}

Tensor TPTransformerBlock::body(const nn::Scope& scope, const Tensor& x) const {
  DISTJAX_CHECK(!moe || !parallel, NotImplemented, "[TPTransformerBlock] \"", scope.path(),
                "\": a Mixture-of-Experts block runs in the sequential block, not the parallel "
                "one (its fused projections hold the MLP's)");
  if (parallel) return parallel_block(scope, x);
  // One device's block (nn's), unless the attention crosses a context split.
  if (layout == TPLayout::None && !context.active())
    return nn::TransformerBlock{.num_heads = num_heads,
                                .causal = causal,
                                .mlp_hidden = mlp_hidden,
                                .dropout = dropout,
                                .ln_eps = ln_eps,
                                .remat_attn = remat_attn,
                                .remat_mlp = remat_mlp,
                                .kernel_init = kernel_init,
                                .out_init = out_init,
                                .segments = segments,
                                .moe = moe}(scope, x);
  return sequential(scope, x);
}

Tensor TPTransformerBlock::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPTransformerBlock", "x");
  DISTJAX_CHECK(x.rank() == 3, InvalidArgument, "[TPTransformerBlock] \"", scope.path(),
                "\" expects x (B, T, C), got ", to_string(x.shape()));
  const int n = layout == TPLayout::None ? 1 : scope.axis_size(axis);
  DISTJAX_CHECK(num_heads > 0 && num_heads % n == 0, ShardingError, "[TPTransformerBlock] \"",
                scope.path(), "\": num_heads=", num_heads, " is not divisible by ", axis, "=", n,
                " (each device computes whole heads)");
  DISTJAX_CHECK(!sequence_parallel || layout == TPLayout::Megatron, ConfigError,
                "[TPTransformerBlock] sequence parallelism needs the megatron layout, got ",
                tp_layout_name(layout));
  if (!remat || scope.is_init() || !tensor::grad_enabled()) return body(scope, x);
  // As nn::TransformerBlock: recompute the block in backward from its parameters and input
  // (the recomputation runs the same collectives on every device).
  const TPTransformerBlock self = *this;
  autodiff::RematFn fn = [self, scope](const tensor::TensorTree& p, const std::vector<Tensor>& in) {
    const nn::Scope s = scope.rebased(&p);
    return std::vector<Tensor>{self.body(s, in[0])};
  };
  return autodiff::checkpoint(fn, scope.params(), {x})[0];
}

}  // namespace distjax::parallel
