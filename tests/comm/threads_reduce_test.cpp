// The threads backend's f32 reduction kernel against the generic rank-order reduction:
// bit-identical for every op, source count, alignment, tail and the streaming path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "distjax/comm/detail/call.hpp"
#include "distjax/comm/threads/reduce.hpp"

namespace distjax::comm::threads {
namespace {

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

TEST(ThreadsReduce, BitIdenticalToRankOrderReduction) {
  // Sizes around the vector widths and the streaming threshold; offsets misalign dst.
  const std::int64_t big = kStreamBytes / 4 + 37;
  for (std::int64_t n : {std::int64_t(0), std::int64_t(1), std::int64_t(15), std::int64_t(17),
                         std::int64_t(64), std::int64_t(1000), big}) {
    for (int k : {1, 2, 3, 5}) {
      std::vector<std::vector<float>> src;
      for (int j = 0; j < k; ++j) src.push_back(values(n + 3, 10 * j + static_cast<int>(n % 7)));
      if (n > 5) src[0][5] = std::numeric_limits<float>::quiet_NaN();  // max's NaN rule
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
        for (int off : {0, 1, 3}) {
          std::vector<const void*> s;
          for (auto& v : src) s.push_back(v.data() + off);
          std::vector<float> want(n + 3, -1.f), got(n + 3, -2.f);
          comm::detail::reduce_into(want.data() + off, s.data(), k, n, DType::F32, op, 3);
          reduce_rank_order(got.data() + off, s.data(), k, n, DType::F32, op, 3);
          expect_bit_equal(want.data() + off, got.data() + off, n, reduce_op_name(op));
          if (::testing::Test::HasFatalFailure()) return;
          if (n == big) break;  // one alignment is enough for the large case
        }
      }
    }
  }
}

TEST(ThreadsReduce, InPlaceOverFirstSource) {
  const std::int64_t n = 4099;
  std::vector<float> a = values(n, 1), b = values(n, 2), want(n);
  const void* s[2] = {a.data(), b.data()};
  comm::detail::reduce_into(want.data(), s, 2, n, DType::F32, ReduceOp::Sum, 2);
  reduce_rank_order(a.data(), s, 2, n, DType::F32, ReduceOp::Sum, 2);
  expect_bit_equal(want.data(), a.data(), n, "in place");
}

TEST(ThreadsReduce, OtherDtypesUseTheGenericPath) {
  std::vector<std::int32_t> a{1, -2, 3}, b{4, 5, -6}, got(3);
  const void* s[2] = {a.data(), b.data()};
  reduce_rank_order(got.data(), s, 2, 3, DType::I32, ReduceOp::Max, 2);
  EXPECT_EQ(got, (std::vector<std::int32_t>{4, 5, 3}));
}

}  // namespace
}  // namespace distjax::comm::threads
