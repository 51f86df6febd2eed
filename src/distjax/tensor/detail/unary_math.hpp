// The unary ops' math, written once for the CPU and the GPU: the approximations of exp,
// tanh and erf the fused kernels use (vectorisable: glibc's expf is a call per element),
// and each unary op's forward f(x) and derivative df(x, y) = f'(x) given y = f(x), in one
// functor. cpu/elementwise.cpp maps them in `omp simd` loops, cuda/elementwise.cu and
// cuda/gemm_epilogue.cu in kernels.
//
// The contraction is settled here: every a * b + c that a compiler could fuse is written
// as fmaf, and nothing else is contractible, so the bits do not depend on the compiler or
// its flags (GCC at -O3 -march=native, a Debug build without FMA, nvcc's --fmad) and are
// the same on every device. UnaryMath.BitsDoNotDependOnContraction checks the CPU's
// kernels against this file compiled with -ffp-contract=off; the CUDA op tests check the
// GPU's against the CPU's. Libm calls (sqrtf, powf, logf) are IEEE-exact or within 2 ulp
// of glibc on the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "distjax/tensor/table/elementwise.hpp"

#if defined(__CUDACC__)
#define DISTJAX_HOST_DEVICE __host__ __device__
#else
#define DISTJAX_HOST_DEVICE
#endif

namespace distjax::tensor::detail::unary_math {

// std::min and std::max as the CPU's loops call them: a NaN first argument comes back
// (fminf and fmaxf would drop it).
DISTJAX_HOST_DEVICE inline float min_of(float a, float b) {
  return b < a ? b : a;
}
DISTJAX_HOST_DEVICE inline float max_of(float a, float b) {
  return a < b ? b : a;
}

DISTJAX_HOST_DEVICE inline std::int32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  std::int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#endif
}
DISTJAX_HOST_DEVICE inline float float_of(std::int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
#endif
}

/// exp(x) in f32, within ~2 ulp of std::exp over its normal range. Returns exactly 0
/// below -87.3 (so masked scores given -inf vanish) and saturates at exp(88.3).
DISTJAX_HOST_DEVICE inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool underflow = x < -87.3f;
  x = min_of(max_of(x, -87.3f), 88.3f);
  const float t = fmaf(x, kLog2e, kShifter);
  const float n = t - kShifter;
  const float r = fmaf(-n, kLn2Lo, fmaf(-n, kLn2Hi, x));  // |r| <= ln2 / 2
  // Taylor polynomial of degree 6 in Horner form: the truncation error is below 1.2e-7.
  float p = 1.f / 720.f;
  p = fmaf(p, r, 1.f / 120.f);
  p = fmaf(p, r, 1.f / 24.f);
  p = fmaf(p, r, 1.f / 6.f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.f);
  p = fmaf(p, r, 1.f);
  const std::int32_t e = (bits_of(t) - 0x4B400000) + 127;
  const float scale = float_of(e << 23);
  return underflow ? 0.f : p * scale;
}

/// tanh(x) in f32 as a 13/6 rational function on [-9, 9] (the approximation Eigen and XLA
/// use): within a few ulp of std::tanh, and exactly x for |x| < 4e-4.
DISTJAX_HOST_DEVICE inline float fast_tanh(float x) {
  const float c = min_of(max_of(x, -9.f), 9.f);
  const float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = fmaf(p, x2, 2.00018790482477e-13f);
  p = fmaf(p, x2, -8.60467152213735e-11f);
  p = fmaf(p, x2, 5.12229709037114e-08f);
  p = fmaf(p, x2, 1.48572235717979e-05f);
  p = fmaf(p, x2, 6.37261928875436e-04f);
  p = fmaf(p, x2, 4.89352455891786e-03f);
  p = p * c;
  float q = 1.19825839466702e-06f;
  q = fmaf(q, x2, 1.18534705686654e-04f);
  q = fmaf(q, x2, 2.26843463243900e-03f);
  q = fmaf(q, x2, 4.89352518554385e-03f);
  return fabsf(x) < 4e-4f ? x : p / q;
}

/// 1 / (1 + exp(-x)); 1 exactly above x = 87.3, below 5e-39 under x = -88.3.
DISTJAX_HOST_DEVICE inline float fast_sigmoid(float x) {
  return 1.f / (1.f + fast_exp(-x));
}

/// erf(x) in f32 (Abramowitz & Stegun 7.1.26 with a fast exp): absolute error < 2e-7.
DISTJAX_HOST_DEVICE inline float fast_erf(float x) {
  const float a = fabsf(x);
  const float t = 1.f / fmaf(0.3275911f, a, 1.f);
  float p = 1.061405429f;
  p = fmaf(p, t, -1.453152027f);
  p = fmaf(p, t, 1.421413741f);
  p = fmaf(p, t, -0.284496736f);
  p = fmaf(p, t, 0.254829592f);
  const float y = fmaf(-(p * t), fast_exp(-a * a), 1.f);
  return x < 0.f ? -y : y;
}

// ---------------------------------------------------------------- the unary ops
// f(x) and, where the op has one, df(x, y) = f'(x) given y = f(x). kCheap: a few flops per
// element (the CPU splits such a loop over threads only when it is long).

struct AddScalar {
  static constexpr bool kCheap = true;
  float c;
  DISTJAX_HOST_DEVICE float f(float v) const { return v + c; }
};

struct MulScalar {
  static constexpr bool kCheap = true;
  float c;
  DISTJAX_HOST_DEVICE float f(float v) const { return v * c; }
};

// pow_scalar's common exponents avoid the libm call so the loop vectorises.
struct Identity {
  static constexpr bool kCheap = true;
  DISTJAX_HOST_DEVICE float f(float v) const { return v; }
  DISTJAX_HOST_DEVICE float df(float, float) const { return 1.f; }
};

struct Square {
  static constexpr bool kCheap = true;
  DISTJAX_HOST_DEVICE float f(float v) const { return v * v; }
  DISTJAX_HOST_DEVICE float df(float v, float) const { return 2.f * v; }
};

struct Cube {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return v * v * v; }
  DISTJAX_HOST_DEVICE float df(float v, float) const { return 3.f * v * v; }
};

struct Sqrt {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return sqrtf(v); }
  DISTJAX_HOST_DEVICE float df(float, float y) const { return 0.5f / y; }
};

struct Reciprocal {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return 1.f / v; }
  DISTJAX_HOST_DEVICE float df(float, float y) const { return -y * y; }
};

struct Pow {
  static constexpr bool kCheap = false;
  float e;
  DISTJAX_HOST_DEVICE float f(float v) const { return powf(v, e); }
  DISTJAX_HOST_DEVICE float df(float v, float) const { return e * powf(v, e - 1.f); }
};

struct Exp {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return fast_exp(v); }
  DISTJAX_HOST_DEVICE float df(float, float y) const { return y; }
};

struct Log {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return logf(v); }
  DISTJAX_HOST_DEVICE float df(float v, float) const { return 1.f / v; }
};

struct Rsqrt {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return 1.f / sqrtf(v); }
  DISTJAX_HOST_DEVICE float df(float v, float y) const { return -0.5f * y / v; }
};

struct Tanh {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return fast_tanh(v); }
  DISTJAX_HOST_DEVICE float df(float, float y) const { return fmaf(-y, y, 1.f); }
};

struct Sigmoid {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return fast_sigmoid(v); }
  DISTJAX_HOST_DEVICE float df(float, float y) const { return y * (1.f - y); }
};

struct Relu {
  static constexpr bool kCheap = true;
  DISTJAX_HOST_DEVICE float f(float v) const { return v > 0.f ? v : 0.f; }
  DISTJAX_HOST_DEVICE float df(float v, float) const { return v > 0.f ? 1.f : 0.f; }
};

inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluA = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;

struct GeluTanh {
  static constexpr bool kCheap = false;
  // tanh(sqrt(2/pi) (v + a v^3)).
  DISTJAX_HOST_DEVICE static float inner(float v) {
    return fast_tanh(kGeluC * fmaf(kGeluA * v * v, v, v));
  }
  DISTJAX_HOST_DEVICE float f(float v) const { return 0.5f * v * (1.f + inner(v)); }
  DISTJAX_HOST_DEVICE float df(float v, float) const {
    const float t = inner(v);
    return fmaf(0.5f * v * fmaf(-t, t, 1.f) * kGeluC, fmaf(3.f * kGeluA * v, v, 1.f),
                0.5f * (1.f + t));
  }
};

struct GeluErf {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return 0.5f * v * (1.f + fast_erf(v * kInvSqrt2)); }
  DISTJAX_HOST_DEVICE float df(float v, float) const {
    return fmaf(v * kInvSqrt2Pi, fast_exp(-0.5f * v * v), 0.5f * (1.f + fast_erf(v * kInvSqrt2)));
  }
};

struct Silu {
  static constexpr bool kCheap = false;
  DISTJAX_HOST_DEVICE float f(float v) const { return v * fast_sigmoid(v); }
  DISTJAX_HOST_DEVICE float df(float v, float) const {
    const float s = fast_sigmoid(v);
    return s * fmaf(v, 1.f - s, 1.f);
  }
};

struct NonZero {
  static constexpr bool kCheap = true;
  DISTJAX_HOST_DEVICE float f(float m) const { return m != 0.f ? 1.f : 0.f; }
};

/// Calls fn with the functor of `op` (false for an unknown code).
template <class F>
bool with_unary(UnaryOp op, float c, F&& fn) {
  switch (op) {
    case UnaryOp::AddScalar:
      return fn(AddScalar{c}), true;
    case UnaryOp::MulScalar:
      return fn(MulScalar{c}), true;
    case UnaryOp::Identity:
      return fn(Identity{}), true;
    case UnaryOp::Square:
      return fn(Square{}), true;
    case UnaryOp::Cube:
      return fn(Cube{}), true;
    case UnaryOp::Sqrt:
      return fn(Sqrt{}), true;
    case UnaryOp::Reciprocal:
      return fn(Reciprocal{}), true;
    case UnaryOp::Pow:
      return fn(Pow{c}), true;
    case UnaryOp::Exp:
      return fn(Exp{}), true;
    case UnaryOp::Log:
      return fn(Log{}), true;
    case UnaryOp::Rsqrt:
      return fn(Rsqrt{}), true;
    case UnaryOp::Tanh:
      return fn(Tanh{}), true;
    case UnaryOp::Sigmoid:
      return fn(Sigmoid{}), true;
    case UnaryOp::Relu:
      return fn(Relu{}), true;
    case UnaryOp::GeluTanh:
      return fn(GeluTanh{}), true;
    case UnaryOp::GeluErf:
      return fn(GeluErf{}), true;
    case UnaryOp::Silu:
      return fn(Silu{}), true;
    case UnaryOp::NonZero:
      return fn(NonZero{}), true;
  }
  return false;
}

}  // namespace distjax::tensor::detail::unary_math
