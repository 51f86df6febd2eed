// The tensor-parallel GPT block in its layouts: Megatron (optionally sequence parallel),
// the toolkit's feature-sharded layout with synchronous gathers and scatters, and the same
// layout with asynchronous ppermute rings.
// Shape legend: B batch, T sequence, C model width, H heads, n = size of the model axis.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "distjax/nn/initializers.hpp"
#include "distjax/nn/moe.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/tp_layout.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::parallel {

using tensor::Tensor;

/// The pre-norm GPT block x + attn(ln1(x)), then x + mlp(ln2(x)), over `axis` in `layout`.
/// Same parameter paths and global shapes as nn::TransformerBlock ("ln1", "attn/qkv",
/// "attn/out", "ln2", "mlp/fc1", "mlp/fc2"), so one device runs the same model with the
/// same parameters. x and the result: (B, T, C) Megatron, (B, T/n, C) sequence parallel,
/// (B, T, C/n) Gather and Async. num_heads must be divisible by n.
struct TPTransformerBlock {
  std::int64_t num_heads = 1;
  /// Causal attention (a decoder); false: every position attends to every other (an encoder).
  bool causal = true;
  /// MLP hidden width; 0 means 4 * C.
  std::int64_t mlp_hidden = 0;
  float dropout = 0.f;
  float ln_eps = 1e-5f;
  bool remat = false;
  /// Rematerialise only the attention ("Attn": ln1 + attn) or only the MLP ("MLP": ln2 +
  /// mlp) of the sequential block (nn/remat.hpp); the parallel block has no separate ones
  /// and takes `remat` only.
  bool remat_attn = false;
  bool remat_mlp = false;
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer out_init = nn::lecun_normal();
  std::string axis = "model";
  TPLayout layout = TPLayout::Megatron;
  /// Megatron only: norms and dropout on (B, T/n, C).
  bool sequence_parallel = false;
  /// Async only: rings in both directions (about half the hops).
  bool bidirectional = false;
  /// The parallel block (GPT-J, PaLM): x + dropout(attn(h) + mlp(h)), h = ln1(x), with
  /// one fused input projection (qkv and fc1 side by side: one gather, or one pvary) and
  /// one fused output projection (out and fc2 stacked: one all-reduce or reduce-scatter)
  /// per block. Parameters as above without "ln2"; dropout from "dropout". Any layout.
  bool parallel = false;
  /// Document ids i32 (B, T) of packed documents (whole T in every layout), or undefined:
  /// each position attends within its own document only.
  Tensor segments = Tensor();
  /// Context parallelism (active: x holds this device's positions of the sequence, and the
  /// attention crosses the split; any layout, sequence parallelism included).
  ContextPlan context{};
  /// A Mixture-of-Experts layer in place of the MLP (nn::TransformerBlock::moe): one
  /// device's block only (no tensor layout, context split or parallel block).
  std::optional<nn::MoE> moe = std::nullopt;

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;

 private:
  Tensor body(const nn::Scope& scope, const Tensor& x) const;
  Tensor sequential(const nn::Scope& scope, const Tensor& x) const;
  Tensor parallel_block(const nn::Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::parallel
