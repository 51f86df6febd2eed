// Initialisers: statistics of the random ones, exact values of the constant ones.
#include <gtest/gtest.h>

#include <cmath>

#include "distjax/nn/initializers.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;

struct Stats {
  double mean = 0, std = 0, max_abs = 0;
};

Stats stats(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  Stats s;
  for (float x : v)
    s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (float x : v) {
    s.std += (x - s.mean) * (x - s.mean);
    s.max_abs = std::max(s.max_abs, static_cast<double>(std::abs(x)));
  }
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

TEST(Initializers, FanIn) {
  EXPECT_EQ(nn::fan_in({256, 64}), 256);
  EXPECT_EQ(nn::fan_in({3, 3, 16, 32}), 3 * 3 * 16);
  EXPECT_EQ(nn::fan_in({10}), 10);
}

TEST(Initializers, LecunNormalHasVarianceOneOverFanIn) {
  Tensor w = nn::lecun_normal()(Key::from_seed(0), {400, 300});
  EXPECT_EQ(w.shape(), (Shape{400, 300}));
  Stats s = stats(w);
  const double want = 1.0 / std::sqrt(400.0);
  EXPECT_NEAR(s.mean, 0.0, 0.01 * want);
  EXPECT_NEAR(s.std, want, 0.02 * want);
  // Truncated at 2 standard deviations of the underlying normal (rescaled by 1/0.8796).
  EXPECT_LE(s.max_abs, 2.0 / 0.87962566 * want + 1e-6);
  EXPECT_GT(s.max_abs, 2.0 * want);
}

TEST(Initializers, NormalAndTruncatedNormal) {
  Stats n = stats(nn::normal(0.02)(Key::from_seed(1), {200, 500}));
  EXPECT_NEAR(n.std, 0.02, 0.0005);
  EXPECT_GT(n.max_abs, 3 * 0.02);  // untruncated tails
  Stats t = stats(nn::truncated_normal(0.5)(Key::from_seed(1), {200, 500}));
  EXPECT_NEAR(t.std, 0.5, 0.01);
  EXPECT_LE(t.max_abs, 2.0 / 0.87962566 * 0.5 + 1e-6);
}

TEST(Initializers, DeterministicByKey) {
  auto a = nn::lecun_normal()(Key::from_seed(4), {8, 8}).to_vector<float>();
  auto b = nn::lecun_normal()(Key::from_seed(4), {8, 8}).to_vector<float>();
  auto c = nn::lecun_normal()(Key::from_seed(5), {8, 8}).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Initializers, ConstantsAndScaled) {
  for (float v : nn::zeros()(Key{}, {3, 2}).to_vector<float>())
    EXPECT_EQ(v, 0.f);
  for (float v : nn::ones()(Key{}, {4}).to_vector<float>())
    EXPECT_EQ(v, 1.f);
  for (float v : nn::constant(2.5)(Key{}, {2, 2}).to_vector<float>())
    EXPECT_EQ(v, 2.5f);
  auto base = nn::lecun_normal()(Key::from_seed(9), {16, 4}).to_vector<float>();
  auto half = nn::scaled(nn::lecun_normal(), 0.5)(Key::from_seed(9), {16, 4}).to_vector<float>();
  ASSERT_EQ(base.size(), half.size());
  for (std::size_t i = 0; i < base.size(); ++i)
    EXPECT_FLOAT_EQ(half[i], 0.5f * base[i]);
}

}  // namespace
