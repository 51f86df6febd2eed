// The GPT of models::Transformer written once in the global view (global/): the same
// program runs on one device, under data parallelism, Megatron tensor parallelism or
// both, depending only on the shardings of its parameters and batch; the propagation
// rules insert the communication. Shape legend: B batch, T sequence, C d_model,
// V vocabulary, H heads.
#pragma once

#include <string>

#include "distjax/global/program.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/parallel/sharding_rules.hpp"

namespace distjax::models {

/// Logits (B, T, V) of tokens (B, T) i32/i64 for a models::Transformer config with
/// learned positions, tied embeddings, sequential pre-norm blocks and no dropout (the
/// parameters are models::Transformer's, by path: "wte/embedding", "wpe/embedding",
/// "blocks/<i>/{ln1,ln2}/{scale,bias}", "blocks/<i>/attn/{qkv,out}/{kernel,bias}",
/// "blocks/<i>/mlp/{fc1,fc2}/{kernel,bias}", "ln_f/{scale,bias}").
global::GlobalArray global_transformer_logits(const TransformerConfig& config,
                                              const global::GlobalTree& params,
                                              const global::GlobalArray& tokens);

/// Mean next-token cross-entropy of the logits against targets (B, T): a scalar.
global::GlobalArray global_transformer_loss(const TransformerConfig& config,
                                            const global::GlobalTree& params,
                                            const global::GlobalArray& tokens,
                                            const global::GlobalArray& targets);

/// The Megatron layout as rules by path over `axis`: qkv and fc1 split by columns (with
/// their biases), the attention output and fc2 by rows; with `vocab_parallel` the token
/// embedding (and so the tied head) split over the vocabulary.
parallel::ShardingRules transformer_megatron_rules(const std::string& axis = "model",
                                                   bool vocab_parallel = false);

}  // namespace distjax::models
