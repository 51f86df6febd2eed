// The counter-based PRNG's fills: element i depends on (key, i) only, and every draw is
// finite, the stream's top word (whose open-unit value has no float below 1 but 1 - 2^-24)
// included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "distjax/core/prng.hpp"

namespace distjax {
namespace {

// Element 6369496 of Key::from_seed(0)'s stream is a word whose top 24 bits are all set:
// the largest uniform a word gives.
constexpr std::int64_t kTopWord = 6369496;

TEST(Prng, TheTopWordDrawsFiniteNormals) {
  const Key key = Key::from_seed(0);
  ASSERT_EQ(key.bits(kTopWord / 2)[kTopWord % 2] >> 8, 0xFFFFFFu);
  float normal = 0, truncated = 0, uniform = 0;
  random_normal(key, &normal, 1, kTopWord);
  random_truncated_normal(key, &truncated, 1, kTopWord);
  random_uniform(key, &uniform, 1, 0.f, 1.f, kTopWord);
  EXPECT_TRUE(std::isfinite(normal)) << normal;
  EXPECT_GT(normal, 5.f);  // the far upper tail
  EXPECT_TRUE(std::isfinite(truncated)) << truncated;
  EXPECT_LE(truncated, 2.f / 0.87962566f);
  EXPECT_LT(uniform, 1.f);
  std::uint8_t kept = 0;
  random_bernoulli(key, &kept, 1, 1.f, kTopWord);
  EXPECT_EQ(kept, 1) << "a Bernoulli(1) draw always keeps";
}

TEST(Prng, AnElementDependsOnItsIndexOnly) {
  const Key key = Key::from_seed(42);
  std::vector<float> whole(1001), part(500);
  random_normal(key, whole.data(), 1001);
  random_normal(key, part.data(), 500, 301);  // an odd offset starts mid-block
  for (std::size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[301 + i]) << i;
}

}  // namespace
}  // namespace distjax
