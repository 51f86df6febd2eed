#include "distjax/nn/multi_head_attention.hpp"

#include "distjax/nn/dense.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {

Tensor MultiHeadAttention::operator()(const Scope& scope, const Tensor& x,
                                      const Tensor& residual) const {
  tensor::check_defined(x, "MultiHeadAttention", "x");
  DISTJAX_CHECK(x.rank() == 3, InvalidArgument, "[MultiHeadAttention] \"", scope.path(),
                "\" expects x (B, T, C), got ", to_string(x.shape()));
  const std::int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  DISTJAX_CHECK(num_heads > 0 && c % num_heads == 0, InvalidArgument, "[MultiHeadAttention] \"",
                scope.path(), "\" width C=", c, " is not divisible by num_heads=", num_heads);
  const std::int64_t h = num_heads, d = c / num_heads;
  const DType compute = scope.precision().compute_dtype;  // the products' operands
  // The projection in the dtype the attention reads as it is (bf16 for cuDNN's).
  const bool bf16_qkv =
      tensor::attention_packed_input_dtype({b, t, 3 * c}, h, causal, compute, x.device(),
                                           segments.defined()) != DType::F32;
  const Dense qkv_proj{
      .features = 3 * c, .kernel_init = kernel_init, .compute_dtype_output = bf16_qkv};
  const Dense out_proj{.features = c, .kernel_init = out_init};
  Tensor qkv = qkv_proj(scope.child("qkv"), x);  // (B, T, 3C)
  if (qkv.rank() == 3 && qkv.size(2) == 3 * c) {
    // Heads read in place from the projection: no permute / split copies. The output comes
    // in the dtype out_proj reads it in (a bf16 attention's output as it is).
    Tensor y = tensor::attention_packed(qkv, h, causal, 0.f, compute, compute,
                                        segments);  // (B, T, C)
    return out_proj(scope.child("out"), y, residual);
  }
  qkv = tensor::reshape(tensor::astype(qkv, DType::F32), {b, t, h, 3, d});
  qkv = tensor::permute(qkv, {3, 0, 2, 1, 4});  // (3, B, H, T, D)
  std::vector<Tensor> parts = tensor::split(qkv, 3, 0);
  const Shape head_shape{b, h, t, d};
  Tensor q = tensor::reshape(parts[0], head_shape);
  Tensor k = tensor::reshape(parts[1], head_shape);
  Tensor v = tensor::reshape(parts[2], head_shape);
  Tensor y = tensor::attention(q, k, v, causal, 0.f, compute, DType::F32,
                               segments);                            // (B, H, T, D)
  y = tensor::reshape(tensor::permute(y, {0, 2, 1, 3}), {b, t, c});  // (B, T, C)
  return out_proj(scope.child("out"), y, residual);
}

}  // namespace distjax::nn
