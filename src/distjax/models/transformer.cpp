#include "distjax/models/transformer.hpp"

#include <cmath>

#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/embedding.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/positions.hpp"
#include "distjax/nn/transformer_block.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::models {

namespace {

constexpr const char* kModelAxis = "model";

}  // namespace

Transformer::Transformer(TransformerConfig config) : config_(config) {
  const auto& c = config_;
  DISTJAX_CHECK(
      c.vocab > 0 && c.d_model > 0 && c.num_layers >= 0 && c.mlp_ratio > 0 && c.max_len > 0,
      ConfigError,
      "[Transformer] vocab, d_model, mlp_ratio, max_len must be > 0 and "
      "num_layers >= 0, got vocab=",
      c.vocab, " d_model=", c.d_model, " num_layers=", c.num_layers, " mlp_ratio=", c.mlp_ratio,
      " max_len=", c.max_len);
  DISTJAX_CHECK(c.num_heads > 0 && c.d_model % c.num_heads == 0, ConfigError,
                "[Transformer] d_model=", c.d_model,
                " is not divisible by num_heads=", c.num_heads);
  DISTJAX_CHECK(c.dropout >= 0.f && c.dropout < 1.f, ConfigError,
                "[Transformer] dropout must be in [0, 1), got ", c.dropout);
}

Tensor Transformer::operator()(const nn::Scope& scope, const Tensor& tokens) const {
  const auto& c = config_;
  tensor::check_defined(tokens, "Transformer", "tokens");
  DISTJAX_CHECK(
      tokens.rank() == 2 && (tokens.dtype() == DType::I32 || tokens.dtype() == DType::I64),
      InvalidArgument, "[Transformer] expected tokens (B, T) of i32/i64, got ", tokens.str(0));
  const std::int64_t t_len = tokens.size(1);
  DISTJAX_CHECK(t_len >= 1 && t_len <= c.max_len, InvalidArgument, "[Transformer] sequence length ",
                t_len, " is outside [1, max_len=", c.max_len, "]");
  // Megatron metadata is recorded only when the init scope has a Specs sink.
  const std::string axis = kModelAxis;

  const nn::Embedding wte{.num_embeddings = c.vocab,
                          .features = c.d_model,
                          .embedding_init = nn::normal(0.02),
                          .embedding_axes = {axis, ""}};
  Tensor x = wte(scope.child("wte"), tokens);  // (B, T, C)
  Tensor pos;
  if (c.learned_positions) {
    const nn::Embedding wpe{
        .num_embeddings = c.max_len, .features = c.d_model, .embedding_init = nn::normal(0.01)};
    pos = tensor::slice(wpe.table(scope.child("wpe")), 0, 0, t_len);  // (T, C)
  } else {
    pos = nn::sinusoidal_positions(t_len, c.d_model);
  }
  x = tensor::add(x, pos);
  x = nn::Dropout{.rate = c.dropout}(scope.child("embed_dropout"), x);

  const double out_scale =
      1.0 / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(c.num_layers, 1)));
  const nn::TransformerBlock block{.num_heads = c.num_heads,
                                   .mlp_hidden = c.mlp_ratio * c.d_model,
                                   .dropout = c.dropout,
                                   .ln_eps = c.ln_eps,
                                   .remat = c.remat,
                                   .kernel_init = nn::lecun_normal(),
                                   .out_init = nn::scaled(nn::lecun_normal(), out_scale),
                                   .model_axis = axis};
  const nn::Scope blocks = scope.child("blocks");
  for (std::int64_t i = 0; i < c.num_layers; ++i)
    x = block(blocks.child(static_cast<int>(i)), x);

  x = nn::LayerNorm{.eps = c.ln_eps}(scope.child("ln_f"), x);
  if (c.tied_embeddings) return wte.attend(scope.child("wte"), x);  // (B, T, V)
  return nn::Dense{.features = c.vocab, .use_bias = false, .kernel_axes = {"", axis}}(
      scope.child("lm_head"), x);
}

TensorTree Transformer::init(Key key) const {
  return init(key, nullptr);
}

TensorTree Transformer::init(Key key, nn::Specs* specs) const {
  TensorTree params;
  tensor::NoGradGuard no_grad;
  (*this)(nn::Scope::init(&params, key, specs), Tensor::zeros({1, 1}, DType::I32));
  return params;
}

Tensor Transformer::apply(const TensorTree& params, const Tensor& tokens, bool train,
                          Key dropout_key) const {
  return (*this)(nn::Scope::apply(&params, train, dropout_key), tokens);
}

std::int64_t Transformer::num_params() const {
  const auto& c = config_;
  const std::int64_t d = c.d_model, h = c.mlp_ratio * c.d_model;
  const std::int64_t per_block = 2 * 2 * d                 // ln1, ln2
                                 + d * 3 * d + 3 * d       // qkv
                                 + d * d + d               // out
                                 + d * h + h + h * d + d;  // mlp
  return c.vocab * d + (c.learned_positions ? c.max_len * d : 0) + c.num_layers * per_block +
         2 * d + (c.tied_embeddings ? 0 : d * c.vocab);
}

std::int64_t Transformer::num_matmul_params() const {
  const auto& c = config_;
  std::int64_t n = num_params();
  if (c.learned_positions) n -= c.max_len * c.d_model;
  if (!c.tied_embeddings) n -= c.vocab * c.d_model;  // the input lookup; lm_head stays
  return n;
}

double Transformer::flops_per_token(std::int64_t seq_len) const {
  const auto& c = config_;
  return 6.0 * static_cast<double>(num_matmul_params()) + 12.0 * static_cast<double>(c.num_layers) *
                                                              static_cast<double>(c.d_model) *
                                                              static_cast<double>(seq_len);
}

}  // namespace distjax::models
