#include "distjax/parallel/tp_async_dense.hpp"

#include "distjax/core/error.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/parallel/tp_async.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

using mesh::P;

Tensor all_gather_matmul(spmd::DeviceContext& ctx, const Tensor& x, const Tensor& kernel,
                         const mesh::Axes& axis, bool bidirectional) {
  const std::int64_t k_local = x.size(-1);
  DISTJAX_CHECK(kernel.rank() == 2 && kernel.size(0) == k_local * ctx.axis_size(axis),
                InvalidArgument, "[all_gather_matmul] kernel ", to_string(kernel.shape()),
                " does not have K = ", k_local, " x ", ctx.axis_size(axis), " rows for x ",
                to_string(x.shape()));
  Tensor y;
  async_gather_apply(
      ctx, x, axis,
      [&](const Tensor& chunk, int source) {
        Tensor rows = tensor::slice(kernel, 0, source * k_local, (source + 1) * k_local);
        Tensor part = tensor::linear(chunk, rows);
        y = y.defined() ? tensor::add(y, part) : part;
      },
      bidirectional ? RingMode::Bidirectional : RingMode::Unidirectional);
  return y;
}

Tensor matmul_reduce_scatter(spmd::DeviceContext& ctx, const Tensor& x, const Tensor& kernel,
                             const mesh::Axes& axis, bool bidirectional) {
  const int n = ctx.axis_size(axis);
  DISTJAX_CHECK(kernel.rank() == 2 && kernel.size(0) == x.size(-1) && kernel.size(1) % n == 0,
                InvalidArgument, "[matmul_reduce_scatter] kernel ", to_string(kernel.shape()),
                " does not fit x ", to_string(x.shape()), " with ", axis.str(), "=", n);
  const std::int64_t f_local = kernel.size(1) / n;
  return async_scatter(
      ctx,
      [&](int block) {
        return tensor::linear(x, tensor::slice(kernel, 1, block * f_local, (block + 1) * f_local));
      },
      axis, bidirectional ? RingMode::Bidirectional : RingMode::Unidirectional);
}

Tensor TPAsyncDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPAsyncDense", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[TPAsyncDense] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  DISTJAX_CHECK(mode != TPMode::None, InvalidArgument, "[TPAsyncDense] \"", scope.path(),
                "\" needs mode Gather or Scatter (TPDense runs None)");
  const mesh::Axes ax(axis);
  const int n = scope.axis_size(ax);
  if (n == 1)  // the same parameters and specs, nothing to overlap
    return TPDense{.features = features,
                   .axis = axis,
                   .mode = mode,
                   .use_bias = use_bias,
                   .kernel_init = kernel_init,
                   .bias_init = bias_init}(scope, x);
  DISTJAX_CHECK(features % n == 0, ShardingError, "[TPAsyncDense] \"", scope.path(),
                "\" features=", features, " is not divisible by ", axis, "=", n);
  const std::int64_t k = x.size(-1) * n;
  Tensor y;
  if (mode == TPMode::Gather) {
    Tensor kernel = scope.param("kernel", {k, features}, kernel_init, P(std::nullopt, axis));
    y = all_gather_matmul(*scope.context(), x, kernel, ax, bidirectional);
  } else {
    Tensor kernel = scope.param("kernel", {k, features}, kernel_init, P(axis, std::nullopt));
    y = matmul_reduce_scatter(*scope.context(), x, kernel, ax, bidirectional);
  }
  if (!use_bias) return y;
  return tensor::add(y, scope.param("bias", {features}, bias_init, P(axis)));
}

}  // namespace distjax::parallel
