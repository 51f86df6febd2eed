#include "distjax/parallel/tp_blocks.hpp"

#include "distjax/nn/dense.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/parallel/tp_async_dense.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"

namespace distjax::parallel {

std::int64_t TPProjections::width(const nn::Scope& scope, const Tensor& x) const {
  const bool features_sharded = layout == TPLayout::Gather || layout == TPLayout::Async;
  return features_sharded ? x.size(-1) * scope.axis_size(axis) : x.size(-1);
}

Tensor TPProjections::in(const nn::Scope& scope, const Tensor& x, std::int64_t features,
                         const nn::Initializer& init, const TPEpilogue& e) const {
  DISTJAX_CHECK(local() || (!e.gelu && !e.compute_dtype_output), InvalidArgument,
                "[TPProjections] \"", scope.path(),
                "\": an epilogue needs a local layout (None or Megatron)");
  switch (layout) {
    case TPLayout::None:
      return nn::Dense{.features = features,
                       .kernel_init = init,
                       .gelu = e.gelu,
                       .compute_dtype_output = e.compute_dtype_output}(scope, x);
    case TPLayout::Megatron: {
      const Tensor h = sequence_parallel ? gather_from_sp_region(scope.context(), x, axis, 1) : x;
      return ColumnParallelDense{.features = features,
                                 .axis = axis,
                                 .kernel_init = init,
                                 .gelu = e.gelu,
                                 .compute_dtype_output = e.compute_dtype_output}(scope, h);
    }
    case TPLayout::Gather:
      return TPDense{
          .features = features, .axis = axis, .mode = TPMode::Gather, .kernel_init = init}(scope,
                                                                                           x);
    case TPLayout::Async:
      return TPAsyncDense{.features = features,
                          .axis = axis,
                          .mode = TPMode::Gather,
                          .bidirectional = bidirectional,
                          .kernel_init = init}(scope, x);
  }
  return x;
}

Tensor TPProjections::out(const nn::Scope& scope, const Tensor& x, std::int64_t features,
                          const nn::Initializer& init) const {
  switch (layout) {
    case TPLayout::None:
      return nn::Dense{.features = features, .kernel_init = init}(scope, x);
    case TPLayout::Megatron:
      return RowParallelDense{.features = features,
                              .axis = axis,
                              .sequence_parallel = sequence_parallel,
                              .kernel_init = init}(scope, x);
    case TPLayout::Gather:
      return TPDense{
          .features = features, .axis = axis, .mode = TPMode::Scatter, .kernel_init = init}(scope,
                                                                                            x);
    case TPLayout::Async:
      return TPAsyncDense{.features = features,
                          .axis = axis,
                          .mode = TPMode::Scatter,
                          .bidirectional = bidirectional,
                          .kernel_init = init}(scope, x);
  }
  return x;
}

Tensor TPMultiHeadAttention::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPMultiHeadAttention", "x");
  const std::int64_t c = proj.width(scope, x);
  const int n = proj.layout == TPLayout::None ? 1 : scope.axis_size(proj.axis);
  DISTJAX_CHECK(num_heads > 0 && num_heads % n == 0 && c % num_heads == 0, ShardingError,
                "[TPMultiHeadAttention] \"", scope.path(), "\": num_heads=", num_heads,
                " must divide C=", c, " and be divisible by ", proj.axis, "=", n,
                " (each device computes whole heads)");
  // Where the projections multiply locally, the attention's output in the compute dtype
  // (bf16 attention writes it as it is) and the projection in the dtype the attention reads
  // as it is (bf16 for cuDNN's); the feature-sharded layouts move the activations in f32.
  const bool local = proj.local();
  const DType compute = scope.precision().compute_dtype;
  if (context.active()) {  // f32 heads across the context split
    DISTJAX_CHECK(!segments.defined(), NotImplemented, "[TPMultiHeadAttention] \"", scope.path(),
                  "\": document ids with context parallelism");
    const Tensor qkv = proj.in(scope.child("qkv"), x, 3 * c, kernel_init);  // (B, T, 3C/n)
    const Tensor h = context_attention_packed(*scope.context(), qkv, num_heads / n, causal, context);
    return proj.out(scope.child("out"), h, c, out_init);
  }
  const std::int64_t t = x.size(1) * (local && proj.sequence_parallel ? n : 1);
  const bool bf16_qkv = local && tensor::attention_packed_input_dtype(
                                     {x.size(0), t, 3 * c / n}, num_heads / n, causal, compute,
                                     x.device(), segments.defined()) != DType::F32;
  Tensor qkv = proj.in(scope.child("qkv"), x, 3 * c, kernel_init,
                       {.compute_dtype_output = bf16_qkv});  // (B, T, 3C/n)
  Tensor h = tensor::attention_packed(qkv, num_heads / n, causal, 0.f, compute,
                                      local ? compute : DType::F32, segments);  // (B, T, C/n)
  return proj.out(scope.child("out"), h, c, out_init);
}

Tensor TPMLPBlock::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPMLPBlock", "x");
  const std::int64_t c = proj.width(scope, x);
  const std::int64_t features = hidden > 0 ? hidden : 4 * c;
  // Where fc2 reads it locally: GELU in fc1's epilogue, in the dtype fc2 reads it in.
  if (proj.local()) {
    const Tensor h = proj.in(scope.child("fc1"), x, features, kernel_init,
                             {.gelu = true, .compute_dtype_output = true});
    return proj.out(scope.child("fc2"), h, c, out_init);
  }
  Tensor h = proj.in(scope.child("fc1"), x, features, kernel_init);
  h = tensor::gelu(h, /*approximate=*/true);
  return proj.out(scope.child("fc2"), h, c, out_init);
}

}  // namespace distjax::parallel
