#include "distjax/parallel/tp_async_dense.hpp"

#include "distjax/core/error.hpp"

namespace distjax::parallel {

Tensor TPAsyncDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  DISTJAX_THROW(NotImplemented, "[TPAsyncDense] not built yet");
}

}  // namespace distjax::parallel
