// TransformerBlock: the pre-norm GPT block, x + attn(ln1(x)), then x + mlp(ln2(x)).
// Shape legend: B batch, T sequence, C model width.
#pragma once

#include <optional>
#include <string>

#include "distjax/nn/moe.hpp"
#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// x (B, T, C) -> (B, T, C):
///   x = x + dropout(attn(ln1(x)));  x = x + dropout(mlp(ln2(x)))
/// Children: "ln1", "attn" (MultiHeadAttention), "ln2", "mlp" (MLPBlock); dropout masks
/// from "attn_dropout" and "mlp_dropout". With `remat`, applying the block runs it
/// under autodiff::checkpoint: its activations are recomputed in the backward pass
/// (same values and gradients, less memory).
struct TransformerBlock {
  std::int64_t num_heads = 1;
  /// Causal attention (a decoder); false: every position attends to every other.
  bool causal = true;
  /// MLP hidden width; 0 means 4 * C.
  std::int64_t mlp_hidden = 0;
  float dropout = 0.f;
  float ln_eps = 1e-5f;
  bool remat = false;
  /// Rematerialise only the attention ("Attn": ln1 + attn) or only the MLP ("MLP": ln2 +
  /// mlp), the toolkit's module names (nn/remat.hpp); with `remat` the whole block is.
  bool remat_attn = false;
  bool remat_mlp = false;
  Initializer kernel_init = lecun_normal();
  /// Initialiser of the two residual output projections (attn/out, mlp/fc2).
  Initializer out_init = lecun_normal();
  /// Document ids (B, T) for the attention (MultiHeadAttention::segments), or undefined.
  Tensor segments = Tensor();
  /// A Mixture-of-Experts layer "moe" in place of the MLP (x + moe(ln2(x))); none: "mlp".
  std::optional<MoE> moe = std::nullopt;

  Tensor operator()(const Scope& scope, const Tensor& x) const;

 private:
  Tensor body(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
