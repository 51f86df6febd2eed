// TPAsyncDense: the toolkit's TPDense with its all-gather or reduce-scatter run as a ring
// of ppermute hops, each hop overlapped with the matmul on the chunk already at hand
// (a collective matmul). Shape legend: K input features, F output features, n = size of
// the model axis.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/nn/initializers.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::parallel {

/// Collective matmul, gather side: all_gather(x) @ kernel with the gather run as a ring.
/// x (..., K/n) varying along `axis`, kernel (K, F') this device's columns -> (..., F').
/// While chunk j+1 travels, chunk j (from device j) multiplies the kernel's rows
/// [j K/n, (j+1) K/n). Equals tensor::linear(all_gather(x, axis, -1, tiled), kernel) up to
/// the f32 summation order; differentiable (the backward is asynchronous too).
Tensor all_gather_matmul(spmd::DeviceContext& ctx, const Tensor& x, const Tensor& kernel,
                         const mesh::Axes& axis, bool bidirectional = false);

/// Collective matmul, scatter side: psum_scatter(x @ kernel) over the last dimension with
/// the reduce-scatter run as a ring. x (..., K/n), kernel (K/n, F) this device's rows ->
/// (..., F/n), block axis_index of the sum. The partial for device j's block of columns is
/// computed just before the ring needs it, overlapping the previous hop.
Tensor matmul_reduce_scatter(spmd::DeviceContext& ctx, const Tensor& x, const Tensor& kernel,
                             const mesh::Axes& axis, bool bidirectional = false);

/// Same parameters, shapes and results as TPDense in the same mode (within f32 summation
/// order), with the communication overlapped:
///  - Gather: x (..., K/n) -> (..., F/n). The chunks x_j of the other devices arrive one
///    ring hop at a time; while chunk j+1 travels, this device multiplies chunk j by the
///    rows [j K/n, (j+1) K/n) of its kernel columns and accumulates. Bias added once.
///  - Scatter: x (..., K/n) -> (..., F/n). The partial product for device j's block of
///    output columns is computed just before it joins the ring reduce-scatter, so each
///    matmul overlaps the previous hop. Bias added once, to this device's block.
/// `bidirectional` sends half the chunks each way (about half the hops).
/// Parameters: "kernel" (K, F) split P(None, axis) (Gather) or P(axis, None) (Scatter),
/// "bias" (F) split P(axis). On one device (or an axis of size 1) it is a plain Dense.
struct TPAsyncDense {
  std::int64_t features = 0;  ///< F, global
  std::string axis = "model";
  TPMode mode = TPMode::Gather;
  bool bidirectional = false;
  bool use_bias = true;
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer bias_init = nn::zeros();

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::parallel
