#include "distjax/nn/dropout.hpp"

#include "distjax/tensor/nn_ops.hpp"

namespace distjax::nn {

Tensor Dropout::operator()(const Scope& scope, const Tensor& x) const {
  DISTJAX_CHECK(rate >= 0.f && rate < 1.f, InvalidArgument, "[Dropout] \"", scope.path(),
                "\" rate must be in [0, 1), got ", rate);
  if (!scope.train() || rate == 0.f) return x;
  return tensor::dropout(x, rate, scope.dropout_key());
}

}  // namespace distjax::nn
