#include "distjax/parallel/tp_async_dense.hpp"

#include "distjax/core/error.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/parallel/tp_async.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

using mesh::P;

namespace {

// The ring's n products each write one disjoint block of the kernel's gradient. Each
// product takes the kernel through an alias (same storage) and hands the next product a
// new alias, so in the backward the products run along that chain and write their blocks
// into one buffer (the last product creates it), instead of n zero-filled (K, F/n) tensors
// the tape adds up. The same for the activation the products share, where each adds into
// the buffer (beta = 1). Doing it in place is safe: an alias has one consumer, the next
// product, so the cotangent it receives is the buffer the chain made, and no backward
// reads the forward values of an accumulator.
Tensor own_or_zeros(const Tensor& g_alias, const Tensor& like) {
  return g_alias.defined() ? g_alias : Tensor::zeros(like.shape(), DType::F32, like.device());
}

void check_f32(const Tensor& x, const Tensor& kernel) {
  DISTJAX_CHECK(x.dtype() == DType::F32 && kernel.dtype() == DType::F32, InvalidArgument,
                "[TPAsyncDense] expects f32 x and kernel, got ", dtype_name(x.dtype()), " and ",
                dtype_name(kernel.dtype()));
}

// Gather ring: y + chunk @ kernel[row0 : row0 + K/n, :], the product accumulated into y's
// storage by the GEMM (beta = 1) instead of a separate add (n - 1 adds of (..., F/n) cost
// about as much memory traffic as the matmuls themselves at these widths); y undefined:
// the first product. Updates y and kernel (the alias for the next product).
// Backward: the cotangent passes to y unchanged; d chunk = g @ rows^T; rows
// [row0, row0 + K/n) of d kernel = chunk^T @ g.
void gather_product(Tensor& y, Tensor& kernel, const Tensor& chunk, std::int64_t row0) {
  check_f32(chunk, kernel);
  const std::int64_t k_local = chunk.size(-1), f = kernel.size(1), m = chunk.numel() / k_local;
  const bool has_y = y.defined();
  Shape shape = chunk.shape();
  shape.back() = f;
  std::vector<Tensor> outputs{has_y ? y.detach() : Tensor::empty(shape, DType::F32, chunk.device()),
                              kernel.detach()};
  tensor::gemm_into(outputs[0], {0, f}, chunk, {0, k_local}, false, kernel, {row0 * f, f}, false, m,
                    f, k_local, 1.f, has_y ? 1.f : 0.f);
  std::vector<Tensor> inputs{chunk, kernel};
  if (has_y) inputs.push_back(y);
  if (!tensor::needs_grad(inputs)) {
    for (Tensor& o : outputs)
      o = tensor::joined(o, inputs);
  } else {
    tensor::record(
        "tp_async_gather_matmul", inputs, outputs,
        [cd = chunk.detach(), kd = kernel.detach(), row0, has_y, rc = chunk.requires_grad(),
         rk = kernel.requires_grad()](const std::vector<Tensor>& g) {
          const std::int64_t k_local = cd.size(-1), f = kd.size(1), m = cd.numel() / k_local;
          std::vector<Tensor> out(has_y ? 3 : 2);
          if (g[0].defined() && rc) {
            out[0] = Tensor::empty(cd.shape(), DType::F32, cd.device());
            tensor::gemm_into(out[0], {0, k_local}, g[0], {0, f}, false, kd, {row0 * f, f}, true, m,
                              k_local, f);
          }
          if (rk) {
            out[1] = own_or_zeros(g[1], kd);
            if (g[0].defined())
              tensor::gemm_into(out[1], {row0 * f, f}, cd, {0, k_local}, true, g[0], {0, f}, false,
                                k_local, f, m);
          }
          if (has_y) out[2] = g[0];
          return out;
        });
  }
  y = outputs[0];
  kernel = outputs[1];
}

// Scatter ring: the partial product for one block of output columns,
// x @ kernel[:, col0 : col0 + F/n], read in place from the kernel (no slice copy). Updates
// x and kernel (the aliases for the next block). Backward: d x = (cotangent of the x alias)
// + g @ cols^T (beta = 1, instead of the tape's n - 1 adds of (..., K/n)); columns
// [col0, col0 + F/n) of d kernel = x^T @ g.
Tensor scatter_product(Tensor& x, Tensor& kernel, std::int64_t col0, std::int64_t f_local) {
  check_f32(x, kernel);
  const std::int64_t k_local = x.size(-1), f = kernel.size(1), m = x.numel() / k_local;
  Shape shape = x.shape();
  shape.back() = f_local;
  std::vector<Tensor> outputs{Tensor::empty(shape, DType::F32, x.device()), x.detach(),
                              kernel.detach()};
  tensor::gemm_into(outputs[0], {0, f_local}, x, {0, k_local}, false, kernel, {col0, f}, false, m,
                    f_local, k_local);
  const std::vector<Tensor> inputs{x, kernel};
  if (!tensor::needs_grad(inputs)) {
    for (Tensor& o : outputs)
      o = tensor::joined(o, inputs);
  } else {
    tensor::record("tp_async_scatter_matmul", inputs, outputs,
                   [xd = x.detach(), kd = kernel.detach(), col0, f_local, rx = x.requires_grad(),
                    rk = kernel.requires_grad()](const std::vector<Tensor>& g) {
                     const std::int64_t k_local = xd.size(-1), f = kd.size(1),
                                        m = xd.numel() / k_local;
                     const Tensor& gp = g[0];
                     std::vector<Tensor> out(2);
                     if (rx) {
                       out[0] = own_or_zeros(g[1], xd);
                       if (gp.defined())
                         tensor::gemm_into(out[0], {0, k_local}, gp, {0, f_local}, false, kd,
                                           {col0, f}, true, m, k_local, f_local, 1.f, 1.f);
                     }
                     if (rk) {
                       out[1] = own_or_zeros(g[2], kd);
                       if (gp.defined())
                         tensor::gemm_into(out[1], {col0, f}, xd, {0, k_local}, true, gp,
                                           {0, f_local}, false, k_local, f_local, m);
                     }
                     return out;
                   });
  }
  x = outputs[1];
  kernel = outputs[2];
  return outputs[0];
}

}  // namespace

Tensor all_gather_matmul(spmd::DeviceContext& ctx, const Tensor& x, const Tensor& kernel,
                         const mesh::Axes& axis, bool bidirectional) {
  const std::int64_t k_local = x.size(-1);
  DISTJAX_CHECK(kernel.rank() == 2 && kernel.size(0) == k_local * ctx.axis_size(axis),
                InvalidArgument, "[all_gather_matmul] kernel ", to_string(kernel.shape()),
                " does not have K = ", k_local, " x ", ctx.axis_size(axis), " rows for x ",
                to_string(x.shape()));
  Tensor y, w = kernel;  // w goes through the alias chain of gather_product
  async_gather_apply(
      ctx, x, axis,
      [&](const Tensor& chunk, int source) { gather_product(y, w, chunk, source * k_local); },
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
  Tensor x_alias = x, w = kernel;  // x and w go through the alias chains of scatter_product
  return async_scatter(
      ctx, [&](int block) { return scatter_product(x_alias, w, block * f_local, f_local); }, axis,
      bidirectional ? RingMode::Bidirectional : RingMode::Unidirectional);
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
