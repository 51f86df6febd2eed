// Transformer: shapes, parameter counts, causality, positions/tying options, specs,
// dropout determinism and FLOP accounting.
#include <gtest/gtest.h>

#include <cmath>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

const models::TransformerConfig kTiny{
    .vocab = 40, .d_model = 16, .num_layers = 2, .num_heads = 2, .mlp_ratio = 4, .max_len = 12};

Tensor tokens_i32(std::int64_t b, std::int64_t t, std::uint32_t seed, std::int64_t vocab) {
  std::vector<std::int32_t> v;
  for (std::int64_t i = 0; i < b * t; ++i)
    v.push_back(static_cast<std::int32_t>(Key::from_seed(seed).bits(std::uint64_t(i))[0] % vocab));
  return Tensor::from_vector(v, {b, t});
}

TEST(Transformer, ShapesAndParamCount) {
  for (bool tied : {true, false})
    for (bool learned : {true, false}) {
      models::TransformerConfig cfg = kTiny;
      cfg.tied_embeddings = tied;
      cfg.learned_positions = learned;
      models::Transformer gpt(cfg);
      TensorTree p = gpt.init(Key::from_seed(0));
      EXPECT_EQ(p.num_elements(), gpt.num_params()) << tied << learned;
      EXPECT_EQ(models::Transformer::num_params(p), gpt.num_params());
      EXPECT_EQ(p.contains("lm_head/kernel"), !tied);
      EXPECT_EQ(p.contains("wpe/embedding"), learned);
      EXPECT_TRUE(p.contains("blocks/1/attn/qkv/kernel"));
      EXPECT_FALSE(p.contains("blocks/2/attn/qkv/kernel"));
      const Tensor logits = gpt.apply(p, tokens_i32(3, 7, 1, cfg.vocab), false, Key{});
      EXPECT_EQ(logits.shape(), (Shape{3, 7, 40}));
      EXPECT_EQ(logits.dtype(), DType::F32);
    }
}

TEST(Transformer, I32AndI64TokensAgree) {
  models::Transformer gpt(kTiny);
  TensorTree p = gpt.init(Key::from_seed(0));
  const Tensor t32 = tokens_i32(2, 5, 3, kTiny.vocab);
  std::vector<std::int64_t> v64;
  for (std::int32_t x : t32.to_vector<std::int32_t>())
    v64.push_back(x);
  const Tensor t64 = Tensor::from_vector(v64, {2, 5});
  EXPECT_EQ(gpt.apply(p, t32, false, Key{}).to_vector<float>(),
            gpt.apply(p, t64, false, Key{}).to_vector<float>());
}

TEST(Transformer, InitIsDeterministic) {
  models::Transformer gpt(kTiny);
  TensorTree a = gpt.init(Key::from_seed(9)), b = gpt.init(Key::from_seed(9)),
             c = gpt.init(Key::from_seed(10));
  for (auto& [path, t] : a)
    EXPECT_EQ(t.to_vector<float>(), b.at(path).to_vector<float>()) << path;
  EXPECT_NE(a.at("wte/embedding").to_vector<float>(), c.at("wte/embedding").to_vector<float>());
  EXPECT_NE(a.at("blocks/0/attn/qkv/kernel").to_vector<float>(),
            a.at("blocks/1/attn/qkv/kernel").to_vector<float>());
}

// Changing token t must not change the logits at positions < t, and must change them
// at position t.
TEST(Transformer, IsCausal) {
  for (bool learned : {true, false}) {
    models::TransformerConfig cfg = kTiny;
    cfg.learned_positions = learned;
    models::Transformer gpt(cfg);
    TensorTree p = gpt.init(Key::from_seed(0));
    const std::int64_t T = 9, V = cfg.vocab;
    const Tensor base = tokens_i32(2, T, 5, V);
    const auto ref = gpt.apply(p, base, false, Key{}).to_vector<float>();
    for (std::int64_t t : {0, 4, 8}) {
      std::vector<std::int32_t> ids = base.to_vector<std::int32_t>();
      for (int b = 0; b < 2; ++b) {
        auto& tok = ids[b * T + t];
        tok = static_cast<std::int32_t>((tok + 7) % V);
      }
      const Tensor changed = Tensor::from_vector(ids, base.shape());
      const auto out = gpt.apply(p, changed, false, Key{}).to_vector<float>();
      for (int b = 0; b < 2; ++b)
        for (std::int64_t s = 0; s < T; ++s) {
          float diff = 0;
          for (std::int64_t v = 0; v < V; ++v) {
            const std::size_t i = std::size_t((b * T + s) * V + v);
            diff = std::max(diff, std::abs(out[i] - ref[i]));
          }
          if (s < t) {
            EXPECT_EQ(diff, 0.f) << "batch " << b << " position " << s << " changed by token " << t;
          } else if (s == t) {
            EXPECT_GT(diff, 1e-4f) << "position " << s << " ignores its own token";
          }
        }
    }
  }
}

TEST(Transformer, DropoutDeterministicByKeyAndRematMatches) {
  models::TransformerConfig cfg = kTiny;
  cfg.dropout = 0.3f;
  models::Transformer gpt(cfg);
  cfg.remat = true;
  models::Transformer gpt_remat(cfg);
  TensorTree p = gpt.init(Key::from_seed(0));
  const Tensor tok = tokens_i32(2, 6, 2, cfg.vocab);
  auto a = gpt.apply(p, tok, true, Key::from_seed(1)).to_vector<float>();
  auto b = gpt.apply(p, tok, true, Key::from_seed(1)).to_vector<float>();
  auto c = gpt.apply(p, tok, true, Key::from_seed(2)).to_vector<float>();
  auto e = gpt.apply(p, tok, false, Key::from_seed(1)).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, e);
  const Tensor targets = tokens_i32(2, 6, 3, cfg.vocab);
  auto loss_of = [&](const models::Transformer& m) {
    return [&](const TensorTree& q) {
      return tensor::mean(tensor::cross_entropy(m.apply(q, tok, true, Key::from_seed(1)), targets));
    };
  };
  auto [l1, g1] = autodiff::value_and_grad(loss_of(gpt))(p);
  auto [l2, g2] = autodiff::value_and_grad(loss_of(gpt_remat))(p);
  EXPECT_FLOAT_EQ(l1.item<float>(), l2.item<float>());
  for (auto& [path, g] : g1) {
    auto x = g.to_vector<float>(), y = g2.at(path).to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(x[i], y[i], 1e-6f) << path;
  }
}

TEST(Transformer, SpecsAndFlops) {
  models::Transformer gpt(kTiny);
  TensorTree p = gpt.init(Key::from_seed(0));
  const std::int64_t n = gpt.num_params() - kTiny.max_len * kTiny.d_model;
  EXPECT_EQ(gpt.num_matmul_params(), n);
  EXPECT_DOUBLE_EQ(gpt.flops_per_token(), 6.0 * n + 12.0 * 2 * 16 * 12);
  EXPECT_DOUBLE_EQ(gpt.flops_per_token(4), 6.0 * n + 12.0 * 2 * 16 * 4);
}

TEST(Transformer, BadInputsAndConfigsThrow) {
  models::Transformer gpt(kTiny);
  TensorTree p = gpt.init(Key::from_seed(0));
  EXPECT_THROW(gpt.apply(p, tokens_i32(1, 13, 0, kTiny.vocab), false, Key{}), InvalidArgument);
  EXPECT_THROW(gpt.apply(p, Tensor::zeros({1, 4}), false, Key{}), InvalidArgument);  // f32 ids
  EXPECT_THROW(gpt.apply(p, Tensor::zeros({4}, DType::I32), false, Key{}), InvalidArgument);
  EXPECT_THROW(models::Transformer({.d_model = 30, .num_heads = 4}), ConfigError);
  models::Transformer other(
      {.vocab = 40, .d_model = 16, .num_layers = 3, .num_heads = 2, .max_len = 12});
  try {
    other.apply(p, tokens_i32(1, 4, 0, 40), false, Key{});
    FAIL() << "expected a missing-parameter error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("blocks/2/"), std::string::npos) << e.what();
  }
}

}  // namespace
