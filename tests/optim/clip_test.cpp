#include "distjax/optim/clip.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"

namespace distjax::optim {
namespace {

using tensor::Tensor;
using tensor::TensorTree;

TensorTree make_grads() {
  TensorTree g;
  g.set("a", Tensor::from_vector<float>({3.f, 0.f}, {2}));
  g.set("b/c", Tensor::from_vector<float>({0.f, 4.f, 0.f, 12.f}, {2, 2}));
  g.set("ids", Tensor::from_vector<std::int32_t>({100, 100}, {2}));  // ignored: not floating
  return g;
}

TEST(Clip, GlobalNormOverAllLeaves) {
  TensorTree g = make_grads();
  EXPECT_DOUBLE_EQ(global_norm_squared(g), 9.0 + 16.0 + 144.0);
  EXPECT_DOUBLE_EQ(global_norm(g), 13.0);
}

TEST(Clip, ScalesOnlyAboveTheThreshold) {
  TensorTree g = make_grads();
  EXPECT_DOUBLE_EQ(clip_by_global_norm(g, 26.0), 13.0);
  EXPECT_EQ(g.at("a").to_vector<float>(), (std::vector<float>{3.f, 0.f}));

  EXPECT_DOUBLE_EQ(clip_by_global_norm(g, 6.5), 13.0);
  EXPECT_EQ(g.at("a").to_vector<float>(), (std::vector<float>{1.5f, 0.f}));
  EXPECT_EQ(g.at("b/c").to_vector<float>(), (std::vector<float>{0.f, 2.f, 0.f, 6.f}));
  EXPECT_EQ(g.at("ids").to_vector<std::int32_t>(), (std::vector<std::int32_t>{100, 100}));
  EXPECT_NEAR(global_norm(g), 6.5, 1e-6);
  EXPECT_THROW(clip_by_global_norm(g, 0.0), InvalidArgument);
}

// Random leaves of awkward sizes (odd, a float4 tail, one over a GPU block's share), on the
// current device.
TensorTree random_grads(float scale) {
  TensorTree g;
  int seed = 0;
  for (std::int64_t n : {1, 7, 1000, 70001}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = scale * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
    g.set("leaf" + std::to_string(seed++), Tensor::from_vector(v, {n}));
  }
  g.set("ids", Tensor::from_vector<std::int32_t>({100, 100}, {2}));
  return g;
}

// The norm and clip factor the device computes (no host wait) are the host's bits: the
// norm rounded to f32, the clipped gradients equal to clip_by_global_norm's.
TEST(Clip, OnTheDeviceEqualsTheHostBitwise) {
  for (double max_norm : {0.0, 1e-3, 1e6}) {
    for (float scale : {1e-3f, 1.f, 3e3f}) {
      TensorTree host = random_grads(scale), dev = random_grads(scale);
      const double norm = max_norm > 0.0 ? clip_by_global_norm(host, max_norm) : global_norm(host);
      const tensor::NormAndClipFactor c = norm_and_clip_factor(dev, max_norm);
      EXPECT_EQ(c.norm.dtype(), DType::F32);
      EXPECT_EQ(c.norm.item<float>(), static_cast<float>(norm)) << max_norm << " " << scale;
      const bool clips = max_norm > 0.0 && norm > max_norm;
      EXPECT_EQ(c.factor.item<float>(), clips ? static_cast<float>(max_norm / norm) : 1.f);
      scale_in_place(dev, c.factor);
      for (const auto& [path, t] : host) {
        if (t.dtype() == DType::F32) {
          EXPECT_EQ(dev.at(path).to_vector<float>(), t.to_vector<float>()) << path;
        }
      }
      EXPECT_EQ(dev.at("ids").to_vector<std::int32_t>(), (std::vector<std::int32_t>{100, 100}));
    }
  }
  // The factor is one f32 element.
  TensorTree g = make_grads();
  EXPECT_THROW(scale_in_place(g, Tensor::from_vector<float>({1.f, 2.f}, {2})), InvalidArgument);
  // No leaves: a zero norm, nothing to clip.
  const tensor::NormAndClipFactor none = norm_and_clip_factor(TensorTree(), 1.0);
  EXPECT_EQ(none.norm.item<float>(), 0.f);
  EXPECT_EQ(none.factor.item<float>(), 1.f);
}

}  // namespace
}  // namespace distjax::optim
