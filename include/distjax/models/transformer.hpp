// Transformer: a GPT-style decoder-only language model.
// Shape legend: B batch, T sequence (<= max_len), C = d_model, V vocabulary, L layers.
#pragma once

#include <cstdint>

#include "distjax/core/prng.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

struct TransformerConfig {
  std::int64_t vocab = 256;       // V
  std::int64_t d_model = 256;     // C
  std::int64_t num_layers = 4;    // L
  std::int64_t num_heads = 4;     // H, divides C
  std::int64_t mlp_ratio = 4;     // MLP hidden = mlp_ratio * C
  std::int64_t max_len = 128;     // longest T
  bool learned_positions = true;  // else fixed sinusoidal positions
  bool tied_embeddings = true;    // logits = x @ wte^T, else an untied lm_head
  float dropout = 0.f;            // on embeddings and residual branches
  bool remat = false;             // recompute each block's activations in backward
  float ln_eps = 1e-5f;
};

/// GPT: tokens (B, T) i32/i64 -> logits (B, T, V) f32.
///   x = wte(tokens) + positions[:T]; dropout
///   x = blocks/0..L-1 (pre-norm TransformerBlock, causal attention, GELU tanh MLP)
///   logits = ln_f(x) @ wte^T   (or lm_head Dense without bias when untied)
/// Parameters: "wte/embedding" (V, C), "wpe/embedding" (max_len, C) if learned,
/// "blocks/<i>/{ln1,ln2}/{scale,bias}", "blocks/<i>/attn/{qkv,out}/{kernel,bias}",
/// "blocks/<i>/mlp/{fc1,fc2}/{kernel,bias}", "ln_f/{scale,bias}", "lm_head/kernel"
/// (C, V) if untied. Init: embeddings N(0, 0.02) / N(0, 0.01), kernels lecun_normal,
/// residual output projections scaled by 1 / sqrt(2 L) (GPT-2).
///
///   models::Transformer gpt({.vocab = 256, .d_model = 128, .num_layers = 2});
///   TensorTree params = gpt.init(Key::from_seed(0));
///   Tensor logits = gpt.apply(params, tokens, /*train=*/false, Key{});
class Transformer {
 public:
  explicit Transformer(TransformerConfig config = {});

  /// Fresh parameters; the same key gives identical parameters on every run.
  TensorTree init(Key key) const;
  /// Same, also recording Megatron-style sharding metadata over mesh axis "model"
  /// (qkv and fc1 column-parallel, out and fc2 row-parallel, wte vocab-parallel).
  TensorTree init(Key key, nn::Specs* specs) const;
  /// Logits for a batch of token ids; dropout only when `train`.
  Tensor apply(const TensorTree& params, const Tensor& tokens, bool train, Key dropout_key) const;
  /// The same forward on any scope.
  Tensor operator()(const nn::Scope& scope, const Tensor& tokens) const;

  /// Parameter count the config gives (equals init(...).num_elements()).
  std::int64_t num_params() const;
  /// Number of elements of a parameter tree.
  static std::int64_t num_params(const TensorTree& params) { return params.num_elements(); }
  /// Parameters that take part in matrix products per token: everything except the
  /// position table and, when untied, the input embedding (lookups cost no FLOPs).
  std::int64_t num_matmul_params() const;
  /// Training FLOPs per token at sequence length max_len: 6 N + 12 L C T (PaLM's
  /// estimate, forward + backward, N = num_matmul_params()).
  double flops_per_token() const { return flops_per_token(config_.max_len); }
  double flops_per_token(std::int64_t seq_len) const;

  const TransformerConfig& config() const { return config_; }

 private:
  TransformerConfig config_;
};

}  // namespace distjax::models
