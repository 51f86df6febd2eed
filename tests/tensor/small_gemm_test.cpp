// The fused kernels' register-blocked small GEMM and transpose against naive loops:
// every micro-tile height and width (row and column tails), A in both layouts, alpha,
// beta 0 (C not read, even if it holds NaN) and 1, leading dimensions wider than the rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "distjax/tensor/cpu/small_gemm.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t x = 2463534242u ^ (seed * 2654435761u);
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    f = static_cast<float>(x % 2001) / 1000.f - 1.f;
  }
  return v;
}

TEST(SmallGemm, MatchesNaiveProductForAllTileShapes) {
  for (std::int64_t m : {1, 5, 6, 7, 13, 32}) {
    for (std::int64_t n : {1, 15, 16, 17, 64, 70, 129}) {
      for (std::int64_t k : {0, 1, 9, 64}) {
        for (bool ta : {false, true}) {
          for (float beta : {0.f, 1.f}) {
            const std::int64_t lda = (ta ? m : k) + 3, ldb = n + 5, ldc = n + 2;
            const std::int64_t a_rows = ta ? k : m;
            std::vector<float> a = values(a_rows * lda + 1, 1), b = values(k * ldb + 1, 2);
            std::vector<float> c = values(m * ldc, 3);
            if (beta == 0.f) c.assign(c.size(), std::numeric_limits<float>::quiet_NaN());
            std::vector<float> want = c;
            const float alpha = 0.75f;
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (std::int64_t p = 0; p < k; ++p)
                  acc += double(ta ? a[p * lda + i] : a[i * lda + p]) * b[p * ldb + j];
                want[i * ldc + j] =
                    static_cast<float>(alpha * acc + (beta != 0.f ? want[i * ldc + j] : 0.0));
              }
            small_gemm(m, n, k, alpha, a.data(), ta ? 1 : lda, ta ? lda : 1, b.data(), ldb, beta,
                       c.data(), ldc);
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < ldc; ++j) {
                const float got = c[i * ldc + j], w = want[i * ldc + j];
                if (j >= n) {  // outside the product: untouched
                  ASSERT_TRUE(std::isnan(w) ? std::isnan(got) : got == w)
                      << "wrote outside C at " << i << "," << j;
                } else {
                  ASSERT_NEAR(got, w, 1e-4f) << m << "x" << n << "x" << k << " ta " << ta
                                             << " beta " << beta << " at " << i << "," << j;
                }
              }
          }
        }
      }
    }
  }
}

TEST(SmallGemm, TransposeMatchesNaive) {
  for (std::int64_t rows : {1, 16, 37, 128})
    for (std::int64_t cols : {3, 16, 64, 70}) {
      const std::int64_t lds = cols + 1, ldd = rows + 2;
      std::vector<float> src = values(rows * lds, 4), dst(cols * ldd, -7.f);
      transpose(src.data(), rows, cols, lds, dst.data(), ldd);
      for (std::int64_t j = 0; j < cols; ++j)
        for (std::int64_t i = 0; i < ldd; ++i)
          ASSERT_EQ(dst[j * ldd + i], i < rows ? src[i * lds + j] : -7.f) << rows << "x" << cols;
    }
}

}  // namespace
}  // namespace distjax::tensor::detail::cpu
