// The unary ops of the elementwise family on the device: the CPU's fast-math approximations
// (tensor/detail/fast_math.hpp), operation for operation, and each op's forward and
// derivative in one functor, written as cpu/elementwise.cpp writes it, so both backends
// agree to f32 rounding. Shared by elementwise.cu and gemm_epilogue.cu (GELU's backward).
// Included by .cu files only.
#pragma once

#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/table/elementwise.hpp"

namespace distjax::tensor::cuda {
namespace {

using detail::UnaryOp;

// ---------------------------------------------------------------- fast_math.hpp on the device
// The CPU's approximations, operation for operation. Each a * b + c that the CPU's compiler
// contracts (GCC at -O3 -march=native: the Horner steps, the range reduction) is written as
// fmaf here, so that nvcc cannot split it differently (it hoists a final add past a branch):
// near tanh's saturation, where gelu takes 1 + tanh, one ulp of tanh is the whole result.

// std::min and std::max as the CPU calls them: a NaN first argument comes back (fminf and
// fmaxf would drop it).
__device__ inline float std_min(float a, float b) {
  return b < a ? b : a;
}
__device__ inline float std_max(float a, float b) {
  return a < b ? b : a;
}

// detail::fast_exp: 0 below -87.3, saturating at exp(88.3).
__device__ inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShifter = 12582912.f;
  const bool underflow = x < -87.3f;
  x = std_min(std_max(x, -87.3f), 88.3f);
  const float t = fmaf(x, kLog2e, kShifter);
  const float n = t - kShifter;
  const float r = fmaf(-n, kLn2Lo, fmaf(-n, kLn2Hi, x));
  float p = 1.f / 720.f;
  p = fmaf(p, r, 1.f / 120.f);
  p = fmaf(p, r, 1.f / 24.f);
  p = fmaf(p, r, 1.f / 6.f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.f);
  p = fmaf(p, r, 1.f);
  const std::int32_t e = (__float_as_int(t) - 0x4B400000) + 127;
  const float scale = __int_as_float(e << 23);
  return underflow ? 0.f : p * scale;
}

// detail::fast_tanh: the 13/6 rational function on [-9, 9].
__device__ inline float fast_tanh(float x) {
  const float c = std_min(std_max(x, -9.f), 9.f);
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

__device__ inline float fast_sigmoid(float x) {
  return 1.f / (1.f + fast_exp(-x));
}

// detail::fast_erf: Abramowitz & Stegun 7.1.26.
__device__ inline float fast_erf(float x) {
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

// ---------------------------------------------------------------- unary ops
// f(x) and, where the op has one, df(x, y) = f'(x) given y = f(x): cpu/elementwise.cpp's
// functors, on the device (libm calls become the device's IEEE-exact sqrt and division and
// its powf and logf, within 2 ulp of glibc's).

struct AddScalar {
  float c;
  __device__ float f(float v) const { return v + c; }
};

struct MulScalar {
  float c;
  __device__ float f(float v) const { return v * c; }
};

struct Identity {
  __device__ float f(float v) const { return v; }
  __device__ float df(float, float) const { return 1.f; }
};

struct Square {
  __device__ float f(float v) const { return v * v; }
  __device__ float df(float v, float) const { return 2.f * v; }
};

struct Cube {
  __device__ float f(float v) const { return v * v * v; }
  __device__ float df(float v, float) const { return 3.f * v * v; }
};

struct Sqrt {
  __device__ float f(float v) const { return sqrtf(v); }
  __device__ float df(float, float y) const { return 0.5f / y; }
};

struct Reciprocal {
  __device__ float f(float v) const { return 1.f / v; }
  __device__ float df(float, float y) const { return -y * y; }
};

struct Pow {
  float e;
  __device__ float f(float v) const { return powf(v, e); }
  __device__ float df(float v, float) const { return e * powf(v, e - 1.f); }
};

struct Exp {
  __device__ float f(float v) const { return fast_exp(v); }
  __device__ float df(float, float y) const { return y; }
};

struct Log {
  __device__ float f(float v) const { return logf(v); }
  __device__ float df(float v, float) const { return 1.f / v; }
};

struct Rsqrt {
  __device__ float f(float v) const { return 1.f / sqrtf(v); }
  __device__ float df(float v, float y) const { return -0.5f * y / v; }
};

struct Tanh {
  __device__ float f(float v) const { return fast_tanh(v); }
  __device__ float df(float, float y) const { return 1.f - y * y; }
};

struct Sigmoid {
  __device__ float f(float v) const { return fast_sigmoid(v); }
  __device__ float df(float, float y) const { return y * (1.f - y); }
};

struct Relu {
  __device__ float f(float v) const { return v > 0.f ? v : 0.f; }
  __device__ float df(float v, float) const { return v > 0.f ? 1.f : 0.f; }
};

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

struct GeluTanh {
  __device__ float f(float v) const {
    return 0.5f * v * (1.f + fast_tanh(kGeluC * (v + kGeluA * v * v * v)));
  }
  __device__ float df(float v, float) const {
    const float t = fast_tanh(kGeluC * (v + kGeluA * v * v * v));
    return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v);
  }
};

struct GeluErf {
  __device__ float f(float v) const { return 0.5f * v * (1.f + fast_erf(v * kInvSqrt2)); }
  // The CPU's sum with GCC's contraction: the second product fused into the add (the sum
  // cancels near x = -0.75, where the choice shows).
  __device__ float df(float v, float) const {
    return fmaf(v * kInvSqrt2Pi, fast_exp(-0.5f * v * v), 0.5f * (1.f + fast_erf(v * kInvSqrt2)));
  }
};

struct Silu {
  __device__ float f(float v) const { return v * fast_sigmoid(v); }
  __device__ float df(float v, float) const {
    const float s = fast_sigmoid(v);
    return s * (1.f + v * (1.f - s));
  }
};

struct NonZero {
  __device__ float f(float m) const { return m != 0.f ? 1.f : 0.f; }
};

// Calls fn with the functor of `op`.
template <class F>
void with_unary(UnaryOp op, float c, F&& fn) {
  switch (op) {
    case UnaryOp::AddScalar:
      return fn(AddScalar{c});
    case UnaryOp::MulScalar:
      return fn(MulScalar{c});
    case UnaryOp::Identity:
      return fn(Identity{});
    case UnaryOp::Square:
      return fn(Square{});
    case UnaryOp::Cube:
      return fn(Cube{});
    case UnaryOp::Sqrt:
      return fn(Sqrt{});
    case UnaryOp::Reciprocal:
      return fn(Reciprocal{});
    case UnaryOp::Pow:
      return fn(Pow{c});
    case UnaryOp::Exp:
      return fn(Exp{});
    case UnaryOp::Log:
      return fn(Log{});
    case UnaryOp::Rsqrt:
      return fn(Rsqrt{});
    case UnaryOp::Tanh:
      return fn(Tanh{});
    case UnaryOp::Sigmoid:
      return fn(Sigmoid{});
    case UnaryOp::Relu:
      return fn(Relu{});
    case UnaryOp::GeluTanh:
      return fn(GeluTanh{});
    case UnaryOp::GeluErf:
      return fn(GeluErf{});
    case UnaryOp::Silu:
      return fn(Silu{});
    case UnaryOp::NonZero:
      return fn(NonZero{});
  }
  DISTJAX_THROW(InvalidArgument, "[unary] unknown op code ", static_cast<int>(op));
}

}  // namespace
}  // namespace distjax::tensor::cuda
