// The CPU's rank-order reduction kernel (the communication backends' reductions) against
// its plain loop: bit-identical for every op, source count, alignment, tail and the
// streaming path of the AVX-512 f32 code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

constexpr const char* kOpNames[] = {"sum", "mean", "max"};

std::vector<float> values(std::int64_t n, int seed) {
  std::vector<float> v(n);
  std::uint32_t x = 2463534242u + 977u * seed;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    // Mixed magnitudes so the rank order of the sum matters in the last bits.
    f = (static_cast<float>(x % 20001) - 10000.f) * ((x >> 20) % 3 == 0 ? 1e-3f : 1.f);
  }
  return v;
}

void expect_bit_equal(const float* a, const float* b, std::int64_t n, const char* what) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t x, y;
    std::memcpy(&x, a + i, 4);
    std::memcpy(&y, b + i, 4);
    ASSERT_EQ(x, y) << what << " differs at " << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(ReduceRanks, BitIdenticalToRankOrderReduction) {
  // Sizes around the vector widths and the streaming threshold; offsets misalign dst.
  const std::int64_t big = (std::int64_t(8) << 20) / 4 + 37;  // streamed from 8 MiB
  for (std::int64_t n : {std::int64_t(0), std::int64_t(1), std::int64_t(15), std::int64_t(17),
                         std::int64_t(64), std::int64_t(1000), big}) {
    for (int k : {1, 2, 3, 5}) {
      std::vector<std::vector<float>> src;
      for (int j = 0; j < k; ++j) src.push_back(values(n + 3, 10 * j + static_cast<int>(n % 7)));
      if (n > 5) src[0][5] = std::numeric_limits<float>::quiet_NaN();  // max's NaN rule
      for (RankReduce op : {RankReduce::Sum, RankReduce::Mean, RankReduce::Max}) {
        for (int off : {0, 1, 3}) {
          std::vector<const void*> s;
          for (auto& v : src) s.push_back(v.data() + off);
          std::vector<float> want(n + 3, -1.f), got(n + 3, -2.f);
          reduce_ranks_generic(want.data() + off, s.data(), k, n, DType::F32, op, 3);
          void* const d[1] = {got.data() + off};
          reduce_ranks(d, 1, s.data(), k, n, DType::F32, op, 3);
          expect_bit_equal(want.data() + off, got.data() + off, n, kOpNames[static_cast<int>(op)]);
          if (::testing::Test::HasFatalFailure()) return;
          if (n == big) break;  // one alignment is enough for the large case
        }
      }
    }
  }
}

TEST(ReduceRanks, InPlaceOverFirstSource) {
  const std::int64_t n = 4099;
  std::vector<float> a = values(n, 1), b = values(n, 2), want(n);
  const void* s[2] = {a.data(), b.data()};
  reduce_ranks_generic(want.data(), s, 2, n, DType::F32, RankReduce::Sum, 2);
  void* const d[1] = {a.data()};
  reduce_ranks(d, 1, s, 2, n, DType::F32, RankReduce::Sum, 2);
  expect_bit_equal(want.data(), a.data(), n, "in place");
}

// An all-reduce's share: one fold written to every rank's block, each destination over
// its own rank's source (in place), plus one apart.
TEST(ReduceRanks, EveryDestinationGetsTheFoldAlsoInPlace) {
  const std::int64_t n = 1031;
  std::vector<std::vector<float>> src{values(n, 3), values(n, 4), values(n, 5)};
  std::vector<float> want(n), apart(n, -1.f);
  const void* s[3] = {src[0].data(), src[1].data(), src[2].data()};
  reduce_ranks_generic(want.data(), s, 3, n, DType::F32, RankReduce::Mean, 3);
  void* const d[4] = {src[0].data(), src[1].data(), src[2].data(), apart.data()};
  reduce_ranks(d, 4, s, 3, n, DType::F32, RankReduce::Mean, 3);
  for (const auto& v : src) expect_bit_equal(want.data(), v.data(), n, "in place");
  expect_bit_equal(want.data(), apart.data(), n, "apart");
}

TEST(ReduceRanks, OtherDtypesUseTheGenericPath) {
  std::vector<std::int32_t> a{1, -2, 3}, b{4, 5, -6}, got(3);
  const void* s[2] = {a.data(), b.data()};
  void* const d[1] = {got.data()};
  reduce_ranks(d, 1, s, 2, 3, DType::I32, RankReduce::Max, 2);
  EXPECT_EQ(got, (std::vector<std::int32_t>{4, 5, 3}));
}

}  // namespace
}  // namespace distjax::tensor::detail::cpu
