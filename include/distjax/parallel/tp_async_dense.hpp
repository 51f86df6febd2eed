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
