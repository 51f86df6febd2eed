#include "distjax/nn/mlp_block.hpp"

#include "distjax/nn/dense.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::nn {

Tensor MLPBlock::operator()(const Scope& scope, const Tensor& x, const Tensor& residual) const {
  tensor::check_defined(x, "MLPBlock", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[MLPBlock] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  const std::int64_t c = x.size(-1);
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  const Dense fc2{.features = c, .kernel_init = out_init};
  if (gelu_approximate) {
    // One op (tensor::gelu_mlp): GELU in fc1's epilogue, written in the dtype fc2 reads it
    // in; in the backward, its derivative and fc1's bias gradient in fc2's dX product.
    const Dense fc1{.features = h, .kernel_init = kernel_init};
    auto [w1, b1] = fc1.params(scope.child("fc1"), c);
    auto [w2, b2] = fc2.params(scope.child("fc2"), h);
    const Precision& p = scope.precision();
    auto compute = [&p](const Tensor& t) { return p.mixed() ? p.cast_to_compute(t) : t; };
    return tensor::gelu_mlp(compute(x), compute(w1), b1, compute(w2), b2, residual);
  }
  const Dense fc1{.features = h, .kernel_init = kernel_init};
  Tensor y = fc1(scope.child("fc1"), x);
  // In the dtype fc2 reads it in: one pass on a device with a bf16-writing kernel.
  y = tensor::gelu(y, gelu_approximate, scope.precision().compute_dtype);
  return fc2(scope.child("fc2"), y, residual);
}

}  // namespace distjax::nn
