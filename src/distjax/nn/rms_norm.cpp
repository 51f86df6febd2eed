#include "distjax/nn/rms_norm.hpp"

#include "distjax/tensor/nn_ops.hpp"

namespace distjax::nn {

Tensor RMSNorm::operator()(const Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "RMSNorm", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[RMSNorm] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  Tensor scale = scope.param("scale", {x.size(-1)}, ones());
  return tensor::rms_norm(x, scale, eps);
}

}  // namespace distjax::nn
