// The f16 storage type's conversions: the software path (compilers without _Float16) rounds
// as IEEE does, and, where the compiler has _Float16, bit for bit as it does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "distjax/core/dtype.hpp"

namespace distjax {
namespace {

bool is_nan_half(std::uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

TEST(F16Software, EveryHalfSurvivesTheRoundTrip) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = detail::f32_from_f16_bits(static_cast<std::uint16_t>(h));
    if (is_nan_half(static_cast<std::uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(detail::f16_bits_from_f32(f), h) << "half bits " << h << " -> " << f;
  }
}

TEST(F16Software, KnownValues) {
  EXPECT_EQ(detail::f32_from_f16_bits(0x3c00), 1.f);
  EXPECT_EQ(detail::f32_from_f16_bits(0xc000), -2.f);
  EXPECT_EQ(detail::f32_from_f16_bits(0x7bff), 65504.f);
  EXPECT_EQ(detail::f32_from_f16_bits(0x0001), std::ldexp(1.f, -24));  // smallest subnormal
  EXPECT_EQ(detail::f32_from_f16_bits(0x0400), std::ldexp(1.f, -14));  // smallest normal
  EXPECT_EQ(detail::f16_bits_from_f32(65519.f), 0x7bff);               // below the midpoint to 2^16
  EXPECT_EQ(detail::f16_bits_from_f32(65520.f), 0x7c00);  // the midpoint ties to even: inf
  EXPECT_EQ(detail::f16_bits_from_f32(1e10f), 0x7c00);
  EXPECT_EQ(detail::f16_bits_from_f32(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(is_nan_half(detail::f16_bits_from_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(detail::f16_bits_from_f32(std::ldexp(1.f, -25)), 0x0000);   // tie to even: 0
  EXPECT_EQ(detail::f16_bits_from_f32(std::ldexp(1.5f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(detail::f16_bits_from_f32(std::ldexp(3.f, -25)), 0x0002);   // 1.5 units: even 2
  EXPECT_EQ(detail::f16_bits_from_f32(-0.f), 0x8000);
  EXPECT_EQ(detail::f16_bits_from_f32(1.f + std::ldexp(1.f, -11)), 0x3c00);  // tie: even 1.0
  EXPECT_EQ(detail::f16_bits_from_f32(1.f + std::ldexp(3.f, -11)), 0x3c02);  // tie: even up
}

// Every float between two neighbouring halves rounds to the nearer one (ties to even).
TEST(F16Software, RoundsToNearestEven) {
  for (std::uint32_t h = 0; h < 0x7bffu; h += 7) {
    const float lo = detail::f32_from_f16_bits(static_cast<std::uint16_t>(h));
    const float hi = detail::f32_from_f16_bits(static_cast<std::uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: halves have 11 significant bits
    EXPECT_EQ(detail::f16_bits_from_f32(std::nextafter(mid, 0.f)), h);
    EXPECT_EQ(detail::f16_bits_from_f32(std::nextafter(mid, 1e9f)), h + 1);
    EXPECT_EQ(detail::f16_bits_from_f32(mid), (h & 1u) ? h + 1 : h);
  }
}

#ifdef __FLT16_MAX__
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(F16Software, MatchesTheCompilersFloat16) {
  // A sweep over the float bit patterns of both signs (NaNs compared as NaN).
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    const float f = from_bits(static_cast<std::uint32_t>(u));
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t want;
    std::memcpy(&want, &h, 2);
    const std::uint16_t got = detail::f16_bits_from_f32(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(is_nan_half(got)) << u;
    } else {
      ASSERT_EQ(got, want) << "float bits " << u;
    }
  }
}
#endif

TEST(F16, StoresThroughTheConversion) {
  EXPECT_EQ(f16(1.f).bits, 0x3c00);
  EXPECT_EQ(static_cast<float>(f16(0.1f)),
            detail::f32_from_f16_bits(detail::f16_bits_from_f32(0.1f)));
  EXPECT_EQ(static_cast<float>(f16(-3.5f)), -3.5f);
}

}  // namespace
}  // namespace distjax
