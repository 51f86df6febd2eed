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
                         const nn::Initializer& init) const {
  switch (layout) {
    case TPLayout::None:
      return nn::Dense{.features = features, .kernel_init = init}(scope, x);
    case TPLayout::Megatron: {
      const Tensor h = sequence_parallel ? gather_from_sp_region(scope.context(), x, axis, 1) : x;
      return ColumnParallelDense{.features = features, .axis = axis, .kernel_init = init}(scope, h);
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
  Tensor qkv = proj.in(scope.child("qkv"), x, 3 * c, kernel_init);           // (B, T, 3C/n)
  // The output in the dtype the out projection reads it in, where that reads it locally
  // (a bf16 attention's output as it is); the feature-sharded layouts move it first.
  const DType compute = scope.precision().compute_dtype;
  const bool local_out = proj.layout == TPLayout::None || proj.layout == TPLayout::Megatron;
  Tensor h = tensor::attention_packed(qkv, num_heads / n, /*causal=*/true, 0.f, compute,
                                      local_out ? compute : DType::F32);  // (B, T, C/n)
  return proj.out(scope.child("out"), h, c, out_init);
}

Tensor TPMLPBlock::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPMLPBlock", "x");
  const std::int64_t c = proj.width(scope, x);
  Tensor h = proj.in(scope.child("fc1"), x, hidden > 0 ? hidden : 4 * c, kernel_init);
  // In the dtype fc2 reads it in, where fc2 reads it locally (as the attention's output).
  const bool local_out = proj.layout == TPLayout::None || proj.layout == TPLayout::Megatron;
  h = tensor::gelu(h, /*approximate=*/true,
                   local_out ? scope.precision().compute_dtype : DType::F32);
  return proj.out(scope.child("fc2"), h, c, out_init);
}

}  // namespace distjax::parallel
