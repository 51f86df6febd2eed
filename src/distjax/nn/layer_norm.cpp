#include "distjax/nn/layer_norm.hpp"

#include "distjax/tensor/nn_ops.hpp"

namespace distjax::nn {

Tensor LayerNorm::operator()(const Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "LayerNorm", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[LayerNorm] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  const std::int64_t c = x.size(-1);
  Tensor scale = scope.param("scale", {c}, ones());
  Tensor bias = use_bias ? scope.param("bias", {c}, zeros()) : Tensor();
  return tensor::layer_norm(x, scale, bias, eps,
                            to_compute ? scope.precision().compute_dtype : DType::F32);
}

}  // namespace distjax::nn
