// The unary ops' bits do not depend on how a compiler contracts a * b + c: the CPU's kernels
// (compiled with the library's flags, -O3 -march=native, vectorised) give, bit for bit, what
// unary_math.hpp's functors give one element at a time in this file, which CMake compiles
// with -ffp-contract=off. A product and sum left to the compiler in unary_math.hpp fails
// here on any machine with FMA; the CUDA op tests check the GPU's kernels against the CPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "distjax/core/dtype.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/detail/unary_math.hpp"

namespace distjax::tensor::detail {
namespace {

constexpr UnaryOp kOps[] = {
    UnaryOp::AddScalar, UnaryOp::MulScalar,  UnaryOp::Identity, UnaryOp::Square, UnaryOp::Cube,
    UnaryOp::Sqrt,      UnaryOp::Reciprocal, UnaryOp::Pow,      UnaryOp::Exp,    UnaryOp::Log,
    UnaryOp::Rsqrt,     UnaryOp::Tanh,       UnaryOp::Sigmoid,  UnaryOp::Relu,   UnaryOp::GeluTanh,
    UnaryOp::GeluErf,   UnaryOp::Silu,       UnaryOp::NonZero};

// Inputs over every op's interesting ranges: the bulk, the saturations of exp and tanh, tiny
// values (tanh's |x| < 4e-4 branch), zeros, infinities and NaN. Sqrt, Log, Pow and Rsqrt
// take the magnitudes (their domain).
std::vector<float> inputs(UnaryOp op) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> bulk(-12.f, 12.f), wide(-100.f, 100.f), tiny(-1e-3f, 1e-3f);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i)
    x.push_back(bulk(gen));
  for (int i = 0; i < 20000; ++i) {
    x.push_back(wide(gen));
    x.push_back(tiny(gen));
  }
  for (float v : {0.f, -0.f, 1e-40f, -1e-40f, 88.3f, -87.3f, 89.f, -88.f, 9.f, -9.f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  if (op == UnaryOp::Sqrt || op == UnaryOp::Log || op == UnaryOp::Pow || op == UnaryOp::Rsqrt)
    for (float& v : x)
      v = std::fabs(v);
  return x;
}

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The first index where the kernel's bits differ from the functor's, or -1. A NaN is any
// NaN: its sign and payload are the hardware's (vector and scalar instructions pass on
// different operands' NaNs), not the math's.
template <class Want>
std::int64_t first_difference(const std::vector<float>& got, Want&& want) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float w = want(i);
    if (std::isnan(got[i]) && std::isnan(w)) continue;
    if (bits(got[i]) != bits(w)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

TEST(UnaryMath, KernelBitsDoNotDependOnContraction) {
  const float c = 2.5f;  // AddScalar's and MulScalar's scalar, Pow's exponent
  for (UnaryOp op : kOps) {
    SCOPED_TRACE("op code " + std::to_string(static_cast<int>(op)));
    const std::vector<float> x = inputs(op);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> y(x.size()), g(x.size()), dx(x.size());
    std::vector<bf16> y16(x.size());
    cpu::elementwise_kernels.unary(op, x.data(), y.data(), n, c);
    cpu::elementwise_kernels.unary_bf16(op, x.data(), y16.data(), n, c);
    for (std::size_t i = 0; i < x.size(); ++i)
      g[i] = 0.75f + 0.001f * static_cast<float>(i % 97);
    bool has_grad = false;
    unary_math::with_unary(op, c, [&](auto u) {
      const std::int64_t at = first_difference(y, [&](std::size_t i) { return u.f(x[i]); });
      EXPECT_EQ(at, -1) << "f(" << (at >= 0 ? x[at] : 0.f) << ")";
      const std::int64_t at16 = first_difference(
          [&] {
            std::vector<float> v(y16.size());
            for (std::size_t i = 0; i < v.size(); ++i)
              v[i] = static_cast<float>(y16[i]);
            return v;
          }(),
          [&](std::size_t i) { return static_cast<float>(bf16(u.f(x[i]))); });
      EXPECT_EQ(at16, -1) << "bf16 f(" << (at16 >= 0 ? x[at16] : 0.f) << ")";
      if constexpr (requires { u.df(0.f, 0.f); }) {
        has_grad = true;
        cpu::elementwise_kernels.unary_grad(op, g.data(), x.data(), y.data(), dx.data(), n, c);
        const std::int64_t atg =
            first_difference(dx, [&](std::size_t i) { return g[i] * u.df(x[i], y[i]); });
        EXPECT_EQ(atg, -1) << "df(" << (atg >= 0 ? x[atg] : 0.f) << ")";
      }
    });
    if (op != UnaryOp::AddScalar && op != UnaryOp::MulScalar && op != UnaryOp::NonZero) {
      EXPECT_TRUE(has_grad);
    }
  }
}

TEST(UnaryMath, UnknownOpCodeIsRefusedNamingIt) {
  float x = 1.f, y = 0.f;
  const auto bad = static_cast<UnaryOp>(250);
  try {
    cpu::elementwise_kernels.unary(bad, &x, &y, 1, 0.f);
    ADD_FAILURE() << "no exception";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("unknown op code 250"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distjax::tensor::detail
