#include "distjax/nn/dense.hpp"

#include "distjax/tensor/matmul.hpp"

namespace distjax::nn {

Tensor Dense::operator()(const Scope& scope, const Tensor& x) const {
  return (*this)(scope, x, Tensor());
}

std::pair<Tensor, Tensor> Dense::params(const Scope& scope, std::int64_t in) const {
  DISTJAX_CHECK(features > 0, InvalidArgument, "[Dense] \"", scope.path(),
                "\" has features=", features);
  // The kernel's global input width: a row-sharded kernel multiplies a feature-sharded x.
  const std::int64_t global_in = in * scope.axis_size(mesh::Axes(kernel_spec.entry(0).axes));
  Tensor kernel = scope.param("kernel", {global_in, features}, kernel_init, kernel_spec);
  Tensor bias = use_bias ? scope.param("bias", {features}, bias_init, bias_spec) : Tensor();
  return {kernel, bias};
}

Tensor Dense::operator()(const Scope& scope, const Tensor& x, const Tensor& residual) const {
  tensor::check_defined(x, "Dense", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[Dense] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  DISTJAX_CHECK(features > 0, InvalidArgument, "[Dense] \"", scope.path(),
                "\" has features=", features);
  auto [kernel, bias] = params(scope, x.size(-1));
  const Precision& policy = scope.precision();
  return linear(policy, x, kernel, bias,
                {.gelu = gelu,
                 .out = compute_dtype_output ? policy.compute_dtype : DType::F32,
                 .residual = residual});
}

}  // namespace distjax::nn
