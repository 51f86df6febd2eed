// Layers against hand-written loops: Dense, Embedding (lookup and attend), LayerNorm,
// RMSNorm, Dropout, MLPBlock and MultiHeadAttention (against naive attention).
#include <gtest/gtest.h>

#include <cmath>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/embedding.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/nn/multi_head_attention.hpp"
#include "distjax/nn/positions.hpp"
#include "distjax/nn/rms_norm.hpp"
#include "distjax/tensor/reduce.hpp"

namespace {

using namespace distjax;
using nn::Scope;
using tensor::Tensor;
using tensor::TensorTree;

Tensor randn(const Shape& s, std::uint64_t seed, double std = 1.0) {
  return nn::normal(std)(Key::from_seed(seed), s);
}

void expect_all_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
}

TEST(Dense, EqualsManualMatmulPlusBias) {
  TensorTree p;
  const Tensor x = randn({3, 5, 4}, 1);  // leading dims are batch dims
  nn::Dense dense{.features = 6, .bias_init = nn::normal(0.5)};
  dense(Scope::init(&p, Key::from_seed(0)), x);
  const Tensor y = dense(Scope::apply(&p, false), x);
  ASSERT_EQ(y.shape(), (Shape{3, 5, 6}));
  auto xv = x.to_vector<float>(), w = p.at("kernel").to_vector<float>(),
       b = p.at("bias").to_vector<float>();
  std::vector<double> want(15 * 6);
  for (int r = 0; r < 15; ++r)
    for (int j = 0; j < 6; ++j) {
      double acc = b[j];
      for (int k = 0; k < 4; ++k)
        acc += double(xv[r * 4 + k]) * w[k * 6 + j];
      want[r * 6 + j] = acc;
    }
  expect_all_near(y.to_vector<float>(), want, 1e-5);
}

TEST(Dense, WithoutBiasHasNoBiasParam) {
  TensorTree p;
  nn::Dense{.features = 2, .use_bias = false}(Scope::init(&p, Key::from_seed(0)),
                                              Tensor::ones({1, 3}));
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"kernel"}));
}

TEST(Dense, GradientOfSumIsColumnSumsOfX) {
  TensorTree p;
  const Tensor x = randn({4, 3}, 2);
  nn::Dense dense{.features = 2};
  dense(Scope::init(&p, Key::from_seed(0)), x);
  auto g = autodiff::grad(
      [&](const TensorTree& q) { return tensor::sum(dense(Scope::apply(&q, false), x)); })(p);
  auto xv = x.to_vector<float>();
  std::vector<double> want;
  for (int k = 0; k < 3; ++k) {
    double s = 0;
    for (int r = 0; r < 4; ++r)
      s += xv[r * 3 + k];
    want.push_back(s);
    want.push_back(s);
  }
  expect_all_near(g.at("kernel").to_vector<float>(), want, 1e-5);
  expect_all_near(g.at("bias").to_vector<float>(), {4.0, 4.0}, 1e-6);
}

TEST(Embedding, LookupAndAttend) {
  TensorTree p;
  nn::Embedding emb{.num_embeddings = 5, .features = 3, .embedding_init = nn::normal(1.0)};
  const Tensor ids = Tensor::from_vector<std::int32_t>({4, 0, 4, 2}, {2, 2});
  emb(Scope::init(&p, Key::from_seed(0)), ids);
  ASSERT_EQ(p.at("embedding").shape(), (Shape{5, 3}));
  const Scope s = Scope::apply(&p, false);
  const Tensor y = emb(s, ids);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 3}));
  auto table = p.at("embedding").to_vector<float>();
  auto yv = y.to_vector<float>();
  const int idv[] = {4, 0, 4, 2};
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(yv[i * 3 + c], table[idv[i] * 3 + c]);
  // attend: x @ E^T.
  const Tensor x = randn({2, 3}, 3);
  auto xv = x.to_vector<float>();
  std::vector<double> want;
  for (int r = 0; r < 2; ++r)
    for (int v = 0; v < 5; ++v) {
      double acc = 0;
      for (int c = 0; c < 3; ++c)
        acc += double(xv[r * 3 + c]) * table[v * 3 + c];
      want.push_back(acc);
    }
  expect_all_near(emb.attend(s, x).to_vector<float>(), want, 1e-5);
  EXPECT_THROW(emb(s, Tensor::ones({2})), InvalidArgument);  // f32 ids
}

TEST(LayerNorm, MatchesFormulaAndParams) {
  TensorTree p;
  const Tensor x = randn({3, 8}, 4, 2.0);
  nn::LayerNorm ln{.eps = 1e-5f};
  ln(Scope::init(&p, Key::from_seed(0)), x);
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"bias", "scale"}));
  p.set("scale", randn({8}, 5));
  p.set("bias", randn({8}, 6));
  auto xv = x.to_vector<float>(), g = p.at("scale").to_vector<float>(),
       b = p.at("bias").to_vector<float>();
  std::vector<double> want;
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < 8; ++c)
      m += xv[r * 8 + c];
    m /= 8;
    for (int c = 0; c < 8; ++c)
      v += (xv[r * 8 + c] - m) * (xv[r * 8 + c] - m);
    v /= 8;
    for (int c = 0; c < 8; ++c)
      want.push_back((xv[r * 8 + c] - m) / std::sqrt(v + 1e-5) * g[c] + b[c]);
  }
  expect_all_near(ln(Scope::apply(&p, false), x).to_vector<float>(), want, 1e-5);
}

TEST(RMSNorm, MatchesFormula) {
  TensorTree p;
  const Tensor x = randn({2, 6}, 7);
  nn::RMSNorm rms{.eps = 1e-6f};
  rms(Scope::init(&p, Key::from_seed(0)), x);
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"scale"}));
  p.set("scale", randn({6}, 8));
  auto xv = x.to_vector<float>(), g = p.at("scale").to_vector<float>();
  std::vector<double> want;
  for (int r = 0; r < 2; ++r) {
    double ms = 0;
    for (int c = 0; c < 6; ++c)
      ms += double(xv[r * 6 + c]) * xv[r * 6 + c];
    ms /= 6;
    for (int c = 0; c < 6; ++c)
      want.push_back(xv[r * 6 + c] / std::sqrt(ms + 1e-6) * g[c]);
  }
  expect_all_near(rms(Scope::apply(&p, false), x).to_vector<float>(), want, 1e-5);
}

TEST(Dropout, IdentityInEvalMaskedInTrain) {
  TensorTree p;
  const Tensor x = Tensor::ones({1000});
  nn::Dropout drop{.rate = 0.25f};
  const Scope eval = Scope::apply(&p, false, Key::from_seed(1));
  EXPECT_TRUE(drop(eval, x).shares_storage_with(x));
  const Scope train = Scope::apply(&p, true, Key::from_seed(1));
  auto a = drop(train.child("d1"), x).to_vector<float>();
  auto a2 = drop(train.child("d1"), x).to_vector<float>();
  auto b = drop(train.child("d2"), x).to_vector<float>();
  EXPECT_EQ(a, a2);  // same scope, same key: same mask
  EXPECT_NE(a, b);   // another scope name: another mask
  int zeros = 0;
  for (float v : a) {
    if (v == 0.f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(v, 1.f / 0.75f);
  }
  EXPECT_GT(zeros, 180);
  EXPECT_LT(zeros, 320);
  EXPECT_THROW((nn::Dropout{.rate = 1.f}(train, x)), InvalidArgument);
}

TEST(MLPBlock, ShapesAndParams) {
  TensorTree p;
  const Tensor x = randn({2, 3, 8}, 9);
  nn::MLPBlock mlp{};
  mlp(Scope::init(&p, Key::from_seed(0)), x);
  EXPECT_EQ(p.at("fc1/kernel").shape(), (Shape{8, 32}));
  EXPECT_EQ(p.at("fc2/kernel").shape(), (Shape{32, 8}));
  EXPECT_EQ(mlp(Scope::apply(&p, false), x).shape(), (Shape{2, 3, 8}));
}

// Naive attention with the (H, 3, D) column layout of the fused qkv kernel.
std::vector<double> naive_mha(const TensorTree& p, const Tensor& x, int H, bool causal) {
  const int B = int(x.size(0)), T = int(x.size(1)), C = int(x.size(2)), D = C / H;
  auto xv = x.to_vector<float>(), wq = p.at("qkv/kernel").to_vector<float>(),
       bq = p.at("qkv/bias").to_vector<float>(), wo = p.at("out/kernel").to_vector<float>(),
       bo = p.at("out/bias").to_vector<float>();
  std::vector<double> qkv(size_t(B) * T * 3 * C);
  for (int r = 0; r < B * T; ++r)
    for (int j = 0; j < 3 * C; ++j) {
      double acc = bq[j];
      for (int k = 0; k < C; ++k)
        acc += double(xv[r * C + k]) * wq[k * 3 * C + j];
      qkv[size_t(r) * 3 * C + j] = acc;
    }
  auto at = [&](int b, int t, int h, int which, int d) {
    return qkv[(size_t(b) * T + t) * 3 * C + h * 3 * D + which * D + d];
  };
  std::vector<double> y(size_t(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(T, -1e300);
        double mx = -1e300;
        for (int u = 0; u < T; ++u) {
          if (causal && u > t) continue;
          double acc = 0;
          for (int d = 0; d < D; ++d)
            acc += at(b, t, h, 0, d) * at(b, u, h, 1, d);
          s[u] = acc / std::sqrt(double(D));
          mx = std::max(mx, s[u]);
        }
        double z = 0;
        for (int u = 0; u < T; ++u)
          z += (causal && u > t) ? 0 : std::exp(s[u] - mx);
        for (int u = 0; u < T; ++u) {
          if (causal && u > t) continue;
          const double w = std::exp(s[u] - mx) / z;
          for (int d = 0; d < D; ++d)
            y[(size_t(b) * T + t) * C + h * D + d] += w * at(b, u, h, 2, d);
        }
      }
  std::vector<double> out(size_t(B) * T * C);
  for (int r = 0; r < B * T; ++r)
    for (int j = 0; j < C; ++j) {
      double acc = bo[j];
      for (int k = 0; k < C; ++k)
        acc += y[size_t(r) * C + k] * wo[k * C + j];
      out[size_t(r) * C + j] = acc;
    }
  return out;
}

TEST(MultiHeadAttention, MatchesNaiveAttention) {
  for (bool causal : {true, false}) {
    TensorTree p;
    const Tensor x = randn({2, 5, 8}, 10);
    nn::MultiHeadAttention mha{.num_heads = 2, .causal = causal};
    mha(Scope::init(&p, Key::from_seed(0)), x);
    EXPECT_EQ(p.at("qkv/kernel").shape(), (Shape{8, 24}));
    EXPECT_EQ(p.at("out/kernel").shape(), (Shape{8, 8}));
    p.set("qkv/bias", randn({24}, 11, 0.3));
    const Tensor y = mha(Scope::apply(&p, false), x);
    ASSERT_EQ(y.shape(), (Shape{2, 5, 8}));
    expect_all_near(y.to_vector<float>(), naive_mha(p, x, 2, causal), 2e-5);
  }
  TensorTree p;
  EXPECT_THROW(
      (nn::MultiHeadAttention{.num_heads = 3}(Scope::init(&p, Key{}), randn({1, 2, 8}, 1))),
      InvalidArgument);
}

}  // namespace

namespace {

TEST(Positions, SinusoidalValues) {
  const Tensor pe = nn::sinusoidal_positions(5, 6);
  ASSERT_EQ(pe.shape(), (Shape{5, 6}));
  auto v = pe.to_vector<float>();
  for (int t = 0; t < 5; ++t)
    for (int j = 0; j < 6; ++j) {
      const double a = t / std::pow(10000.0, (j - j % 2) / 6.0);
      EXPECT_NEAR(v[t * 6 + j], j % 2 == 0 ? std::sin(a) : std::cos(a), 1e-6) << t << "," << j;
    }
  EXPECT_EQ(v[0], 0.f);  // sin(0)
  EXPECT_EQ(v[1], 1.f);  // cos(0)
}

}  // namespace
