#include "distjax/optim/clip.hpp"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace distjax::optim
