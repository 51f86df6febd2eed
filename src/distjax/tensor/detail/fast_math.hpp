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

/// tanh(x) in f32 as a 13/6 rational function on [-9, 9] (the approximation Eigen and XLA
/// use): within a few ulp of std::tanh, and exactly x for |x| < 4e-4.
inline float fast_tanh(float x) {
  const float c = std::min(std::max(x, -9.f), 9.f);
  const float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * c;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return std::abs(x) < 4e-4f ? x : p / q;
}

/// 1 / (1 + exp(-x)); 1 exactly above x = 87.3, below 5e-39 under x = -88.3.
inline float fast_sigmoid(float x) {
  return 1.f / (1.f + fast_exp(-x));
}

/// erf(x) in f32 (Abramowitz & Stegun 7.1.26 with a fast exp): absolute error < 2e-7.
inline float fast_erf(float x) {
  const float a = std::abs(x);
  const float t = 1.f / (1.f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t + -1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t + -0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.f - p * t * fast_exp(-a * a);
  return x < 0.f ? -y : y;
}

/// Maximum of p[0..n) (-inf for n == 0).
inline float row_max(const float* p, std::int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (std::int64_t i = 0; i < n; ++i)
    m = std::max(m, p[i]);
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
  for (std::int64_t i = 0; i < n; ++i)
    s += fast_exp(x[i] - m);
  return m + std::log(s);
}

}  // namespace distjax::tensor::detail
