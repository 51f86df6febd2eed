#include "distjax/nn/remat.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::nn {

tensor::Tensor remat_call(bool on, const Scope& scope, const tensor::Tensor& x, const ScopedFn& f) {
  if (!on || scope.is_init() || !tensor::grad_enabled()) return f(scope, x);
  autodiff::RematFn fn = [f, scope](const tensor::TensorTree& p,
                                    const std::vector<tensor::Tensor>& in) {
    return std::vector<tensor::Tensor>{f(scope.rebased(&p), in[0])};
  };
  return autodiff::checkpoint(fn, scope.params(), {x})[0];
}

}  // namespace distjax::nn
