// MultiHeadAttention: causal self-attention with a fused qkv projection.
// Shape legend: B batch, T sequence, C model width, H heads, D = C / H head width.
#pragma once

#include <string>

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// Self-attention: x (B, T, C) -> (B, T, C).
///  qkv = x @ qkv/kernel + qkv/bias, (B, T, 3C), whose columns are laid out (H, 3, D):
///  head h owns columns [3Dh, 3D(h+1)) holding its q, k and v (Megatron's layout, so
///  sharding the columns over a model axis gives each device whole heads).
///  q, k, v (B, H, T, D) -> tensor::attention (scale D^-0.5) -> (B, T, C) -> "out" Dense.
/// Parameters: "qkv/kernel" (C, 3C), "qkv/bias" (3C), "out/kernel" (C, C), "out/bias" (C).
struct MultiHeadAttention {
  std::int64_t num_heads = 1;
  bool causal = true;
  Initializer kernel_init = lecun_normal();
  /// Initialiser of the output projection (GPT-2 scales it by 1 / sqrt(2 L)).
  Initializer out_init = lecun_normal();
  /// Document ids i32 (B, T) of packed documents, or undefined: each position attends
  /// within its own document only (tensor::attention's `segments`).
  Tensor segments = Tensor();

  /// With a `residual` (B, T, C): residual + attention(x), the add in the out projection.
  Tensor operator()(const Scope& scope, const Tensor& x, const Tensor& residual = Tensor()) const;
};

}  // namespace distjax::nn
