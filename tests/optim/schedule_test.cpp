#include "distjax/optim/schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "distjax/core/error.hpp"

namespace distjax::optim {
namespace {

TEST(Schedule, Constant) {
  Schedule s = constant_schedule(3e-4);
  EXPECT_DOUBLE_EQ(s(0), 3e-4);
  EXPECT_DOUBLE_EQ(s(123456), 3e-4);
}

TEST(Schedule, Linear) {
  Schedule s = linear_schedule(1.0, 0.0, 4);
  EXPECT_DOUBLE_EQ(s(0), 1.0);
  EXPECT_DOUBLE_EQ(s(1), 0.75);
  EXPECT_DOUBLE_EQ(s(4), 0.0);
  EXPECT_DOUBLE_EQ(s(100), 0.0);
}

TEST(Schedule, CosineDecay) {
  Schedule s = cosine_decay_schedule(2.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(s(0), 2.0);
  EXPECT_NEAR(s(5), 2.0 * (0.9 * 0.5 + 0.1), 1e-12);
  EXPECT_NEAR(s(10), 0.2, 1e-12);
  EXPECT_NEAR(s(50), 0.2, 1e-12);
}

TEST(Schedule, WarmupCosineMatchesOptaxFormula) {
  Schedule s = warmup_cosine_schedule(0.0, 1.0, 10, 110, 0.1);
  EXPECT_DOUBLE_EQ(s(0), 0.0);
  EXPECT_DOUBLE_EQ(s(5), 0.5);
  EXPECT_DOUBLE_EQ(s(10), 1.0);
  // Halfway through the decay: end + (peak - end) * 0.5.
  EXPECT_NEAR(s(60), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(s(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-12);
  EXPECT_NEAR(s(110), 0.1, 1e-12);
  EXPECT_NEAR(s(1000), 0.1, 1e-12);
  // Monotone decreasing after the peak.
  for (int i = 10; i < 110; ++i)
    EXPECT_GE(s(i), s(i + 1));
  EXPECT_THROW(warmup_cosine_schedule(0.0, 1.0, 10, 10), InvalidArgument);
}

}  // namespace
}  // namespace distjax::optim
