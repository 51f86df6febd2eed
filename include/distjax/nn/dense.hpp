// Dense: the fully connected layer y = x @ kernel + bias.
#pragma once

#include <utility>

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// Fully connected layer over the last dimension.
///  x (..., K) f32 -> (..., features), f32 (or the compute dtype: compute_dtype_output).
///  Parameters: "kernel" (K, features), "bias" (features).
///
///   Tensor h = Dense{.features = 512}(scope.child("fc1"), x);
struct Dense {
  std::int64_t features = 0;
  bool use_bias = true;
  Initializer kernel_init = lecun_normal();
  Initializer bias_init = zeros();
  /// How the parameters are split over the mesh (empty = replicated), e.g.
  /// P(std::nullopt, "model") for a column-parallel kernel. On a scope bound to a device
  /// (Scope::on) the layer holds and multiplies by its local shards: the caller brings
  /// the matching input and communication (parallel/tensor_parallel.hpp does).
  mesh::PartitionSpec kernel_spec{};
  mesh::PartitionSpec bias_spec{};
  /// GELU in its tanh form applied to x @ kernel + bias in the product's epilogue (one
  /// kernel on CUDA; the backward keeps the pre-activation in the output's dtype).
  bool gelu = false;
  /// Writes the output in the scope's compute dtype (bf16 under Precision::bf16()) instead
  /// of f32: for a layer whose consumer reads that dtype anyway (a matmul, bf16 attention).
  bool compute_dtype_output = false;

  Tensor operator()(const Scope& scope, const Tensor& x) const;
  /// The layer's kernel (K, features) and bias (undefined without use_bias) for an input
  /// of `in` features, as the layer holds them (the local shards on a bound scope): for an
  /// op that multiplies by them itself (tensor::gelu_mlp).
  std::pair<Tensor, Tensor> params(const Scope& scope, std::int64_t in) const;
  /// residual + Dense(x): the residual connection's add in the product (an f32 output, no
  /// GELU), the bits of tensor::add(residual, (*this)(scope, x)) on the CPU.
  Tensor operator()(const Scope& scope, const Tensor& x, const Tensor& residual) const;
};

}  // namespace distjax::nn
