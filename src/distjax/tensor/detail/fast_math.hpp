// The CPU's row helpers that softmax, norms, cross-entropy and attention share, on the
// vectorisable exp of unary_math.hpp (glibc's expf is a call per element; this one GCC
// turns into AVX-512 code inside `#pragma omp simd` loops).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "distjax/tensor/detail/unary_math.hpp"

namespace distjax::tensor::detail {

using unary_math::fast_erf;
using unary_math::fast_exp;
using unary_math::fast_sigmoid;
using unary_math::fast_tanh;

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
