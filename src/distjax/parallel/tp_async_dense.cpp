#include "distjax/parallel/tp_async_dense.hpp"

#include "distjax/core/error.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/parallel/tp_async.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

using mesh::P;

Tensor TPAsyncDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPAsyncDense", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[TPAsyncDense] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  DISTJAX_CHECK(mode != TPMode::None, InvalidArgument, "[TPAsyncDense] \"", scope.path(),
                "\" needs mode Gather or Scatter (TPDense runs None)");
  spmd::DeviceContext* ctx = scope.context();
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
  const RingMode ring = bidirectional ? RingMode::Bidirectional : RingMode::Unidirectional;
  const std::int64_t k_local = x.size(-1), k = k_local * n, f_local = features / n;
  Tensor y;
  if (mode == TPMode::Gather) {
    // kernel (K, F/n): chunk j of x multiplies rows [j K/n, (j+1) K/n), while chunk j+1
    // is on its way.
    Tensor kernel = scope.param("kernel", {k, features}, kernel_init, P(std::nullopt, axis));
    async_gather_apply(
        *ctx, x, ax,
        [&](const Tensor& chunk, int source) {
          Tensor rows = tensor::slice(kernel, 0, source * k_local, (source + 1) * k_local);
          Tensor part = tensor::linear(chunk, rows);
          y = y.defined() ? tensor::add(y, part) : part;
        },
        ring);
  } else {
    // kernel (K/n, F): the partial for device j's output block, computed just before the
    // ring needs it, so the matmul overlaps the previous hop.
    Tensor kernel = scope.param("kernel", {k, features}, kernel_init, P(axis, std::nullopt));
    y = async_scatter(
        *ctx,
        [&](int block) {
          return tensor::linear(x, tensor::slice(kernel, 1, block * f_local, (block + 1) * f_local));
        },
        ax, ring);
  }
  if (!use_bias) return y;
  return tensor::add(y, scope.param("bias", {features}, bias_init, P(axis)));
}

}  // namespace distjax::parallel
