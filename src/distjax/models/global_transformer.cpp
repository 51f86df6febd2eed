#include "distjax/models/global_transformer.hpp"

#include "distjax/core/error.hpp"
#include "distjax/global/attention.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/nn_ops.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/global/shape_ops.hpp"

namespace distjax::models {

using global::GlobalArray;
using global::GlobalTree;

namespace {

struct Params {
  const GlobalTree& p;
  std::string prefix;
  const GlobalArray& operator[](const std::string& name) const {
    const auto it = p.find(prefix + name);
    DISTJAX_CHECK(it != p.end(), InvalidArgument, "[global_transformer] missing parameter \"",
                  prefix + name, "\"");
    return it->second;
  }
};

GlobalArray dense(const Params& p, const std::string& name, const GlobalArray& x) {
  return global::add(global::matmul(x, p[name + "/kernel"]), p[name + "/bias"]);
}

GlobalArray norm(const Params& p, const std::string& name, const GlobalArray& x, float eps) {
  return global::layer_norm(x, p[name + "/scale"], p[name + "/bias"], eps);
}

}  // namespace

GlobalArray global_transformer_logits(const TransformerConfig& c, const GlobalTree& params,
                                      const GlobalArray& tokens) {
  DISTJAX_CHECK(c.learned_positions && c.tied_embeddings && !c.parallel_block && c.dropout == 0.f,
                ConfigError,
                "[global_transformer] supports learned positions, tied embeddings, sequential "
                "blocks and no dropout");
  const std::int64_t t_len = tokens.size(1);
  const Params top{params, ""};
  // Embedding: (B, T, C); positions (T, C) broadcast over B.
  GlobalArray x = global::add(global::embedding(top["wte/embedding"], tokens),
                              global::slice(top["wpe/embedding"], 0, 0, t_len));
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const Params b{params, "blocks/" + std::to_string(i) + "/"};
    GlobalArray h = norm(b, "ln1", x, c.ln_eps);
    GlobalArray qkv = dense(b, "attn/qkv", h);                         // (B, T, 3C)
    GlobalArray a = global::attention_packed(qkv, c.num_heads, true);  // (B, T, C)
    x = global::add(x, dense(b, "attn/out", a));
    h = norm(b, "ln2", x, c.ln_eps);
    h = global::gelu(dense(b, "mlp/fc1", h), true);
    x = global::add(x, dense(b, "mlp/fc2", h));
  }
  x = norm(top, "ln_f", x, c.ln_eps);
  return global::matmul(x, top["wte/embedding"], /*trans_b=*/true);  // (B, T, V)
}

GlobalArray global_transformer_loss(const TransformerConfig& c, const GlobalTree& params,
                                    const GlobalArray& tokens, const GlobalArray& targets) {
  return global::mean(global::cross_entropy(global_transformer_logits(c, params, tokens), targets));
}

parallel::ShardingRules transformer_megatron_rules(const std::string& axis, bool vocab_parallel) {
  using mesh::P;
  std::vector<parallel::ShardingRule> rules{{"attn/qkv/kernel$", P(std::nullopt, axis)},
                                            {"attn/qkv/bias$", P(axis)},
                                            {"attn/out/kernel$", P(axis, std::nullopt)},
                                            {"mlp/fc1/kernel$", P(std::nullopt, axis)},
                                            {"mlp/fc1/bias$", P(axis)},
                                            {"mlp/fc2/kernel$", P(axis, std::nullopt)}};
  if (vocab_parallel) rules.push_back({"wte/embedding$", P(axis, std::nullopt)});
  return parallel::ShardingRules(std::move(rules));
}

}  // namespace distjax::models
