// Vectorisable float math for the fused kernels: an exp that GCC turns into AVX-512
// code inside `#pragma omp simd` loops (glibc's expf is a call per element), and the
// small row helpers softmax, norms, cross-entropy and attention share.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace distjax::tensor::detail {

/// exp(x) in f32, within ~2 ulp of std::exp over its normal range. Returns exactly 0
/// below -87.3 (so masked scores given -inf vanish) and saturates at exp(88.3).
inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool underflow = x < -87.3f;
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float t = x * kLog2e + kShifter;
  const float n = t - kShifter;
  const float r = x - n * kLn2Hi - n * kLn2Lo;  // |r| <= ln2 / 2
  // Taylor polynomial of degree 6 in Horner form: the truncation error is below 1.2e-7.
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const std::int32_t e = (std::bit_cast<std::int32_t>(t) - 0x4B400000) + 127;
  const float scale = std::bit_cast<float>(e << 23);
  return underflow ? 0.f : p * scale;
}

/// Maximum of p[0..n) (-inf for n == 0).
inline float row_max(const float* p, std::int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  return m;
}

/// out[i] = exp(x[i] - shift) and returns their sum (out may alias x).
inline float exp_shifted_sum(const float* x, float* out, std::int64_t n, float shift) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) {
    const float e = fast_exp(x[i] - shift);
    out[i] = e;
    s += e;
  }
  return s;
}

/// log(sum(exp(x[0..n)))) computed stably (-inf for n == 0 or all -inf).
inline float row_logsumexp(const float* x, std::int64_t n) {
  const float m = row_max(x, n);
  if (!(m > -INFINITY)) return -INFINITY;
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += fast_exp(x[i] - m);
  return m + std::log(s);
}

}  // namespace distjax::tensor::detail
