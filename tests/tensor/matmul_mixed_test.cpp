// matmul and linear on bf16 and f16 operands (the compute dtypes of nn::Precision): the
// result is the f32 product of the rounded operands (f32 accumulation) and so lies within
// bf16 rounding of the f32 product; gradients come back f32 and match the f32 gradients
// of the rounded operands with the cotangent rounded the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "checked_parity.hpp"
#include "test_tensors.hpp"

namespace distjax::tensor {
namespace {

using testing::randn;
using testing::rounded;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.dtype(), DType::F32);
  EXPECT_EQ(b.dtype(), DType::F32);
  const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i)
    m = std::max(m, std::abs(double(va[i]) - double(vb[i])));
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (float v : a.to_vector<float>())
    m = std::max(m, std::abs(double(v)));
  return m;
}

struct Case {
  Shape a, b;
  bool ta, tb;
};

TEST(MatmulMixed, Bf16ProductIsTheF32ProductOfRoundedOperandsAndNearF32) {
  const std::vector<Case> cases = {
      {{64, 96}, {96, 48}, false, false},    {{96, 64}, {96, 48}, true, false},
      {{64, 96}, {48, 96}, false, true},     {{3, 17, 40}, {3, 40, 9}, false, false},
      {{4, 33, 72}, {72, 65}, false, false}, {{2, 40, 17}, {2, 9, 40}, true, true},
      // A transposed B whose N is not a multiple of 16 (oneDNN 2.6's threaded bf16 kernel
      // got these wrong; the CPU lays such a B out (K, N) first).
      {{21, 16}, {50, 16}, false, true},     {{3, 7, 32}, {50, 32}, false, true},
      {{32, 16}, {50, 16}, false, true}};
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(c.a) + " @ " + to_string(c.b));
    const Tensor a = randn(c.a, seed++), b = randn(c.b, seed++);
    const Tensor got = matmul(astype(a, DType::BF16), astype(b, DType::BF16), c.ta, c.tb);
    ASSERT_EQ(got.dtype(), DType::F32);
    const Tensor exact_rounded =
        matmul(rounded(a, DType::BF16), rounded(b, DType::BF16), c.ta, c.tb);
    const Tensor f32 = matmul(a, b, c.ta, c.tb);
    const double k = double(c.ta ? c.a.back() : c.a[c.a.size() - 2] == 0 ? 1 : c.a.back());
    // Products of bf16 values are exact in f32; only the f32 summation order differs.
    EXPECT_LE(max_abs_diff(got, exact_rounded), 1e-5 * max_abs(f32) + 1e-5 * std::sqrt(k));
    // Against f32: each operand carries a relative error <= 2^-9, so each product <= 2^-8,
    // and over K random-signed terms the error grows like sqrt(K) * 2^-8 (4x margin).
    EXPECT_LE(max_abs_diff(got, f32), 4.0 * std::sqrt(k) * std::ldexp(1.0, -8));
    EXPECT_GT(max_abs_diff(got, f32), 0.0);  // it really rounded
  }
}

TEST(MatmulMixed, LinearBf16WithBiasAndF16) {
  const Tensor x = randn({5, 7, 96}, 11), w = randn({96, 80}, 12), bias = randn({80}, 13);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor got = linear(astype(x, dt), astype(w, dt), bias);
    ASSERT_EQ(got.dtype(), DType::F32);
    EXPECT_EQ(got.shape(), (Shape{5, 7, 80}));
    const Tensor want = linear(rounded(x, dt), rounded(w, dt), bias);
    EXPECT_LE(max_abs_diff(got, want), 1e-4);
    EXPECT_LE(max_abs_diff(got, linear(x, w, bias)), 4.0 * std::sqrt(96.0) * std::ldexp(1.0, -8));
  }
}

TEST(MatmulMixed, F16OperandsOverflowToInfinity) {
  // f16's range ends at 65504: the cast overflows, which is what loss scaling guards.
  const Tensor x = Tensor::full({1, 2}, 1e5), w = Tensor::ones({2, 2});
  const Tensor y = linear(astype(x, DType::F16), astype(w, DType::F16));
  EXPECT_TRUE(std::isinf(y.to_vector<float>()[0]));
  const Tensor yb = linear(astype(x, DType::BF16), astype(w, DType::BF16));
  EXPECT_TRUE(std::isfinite(yb.to_vector<float>()[0]));  // bf16 has f32's range
}

TEST(MatmulMixed, GradientsThroughTheCastAreF32AndNearTheF32Gradients) {
  const Tensor x = randn({6, 10, 64}, 21), w = randn({64, 32}, 22), bias = randn({32}, 23);
  const Tensor r = randn({6, 10, 32}, 24);  // a random cotangent through sum(y * r)
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto loss = [&](DType compute) {
      return [&, compute](const TensorTree& p) {
        Tensor xc = compute == DType::F32 ? p.at("x") : astype(p.at("x"), compute);
        Tensor wc = compute == DType::F32 ? p.at("w") : astype(p.at("w"), compute);
        return sum(mul(linear(xc, wc, p.at("b")), r));
      };
    };
    TensorTree params;
    params.set("x", x);
    params.set("w", w);
    params.set("b", bias);
    const TensorTree g = autodiff::grad(loss(dt))(params);
    const TensorTree g32 = autodiff::grad(loss(DType::F32))(params);
    // The reference: f32 gradients of the rounded operands with the cotangent rounded.
    TensorTree rp;
    rp.set("x", rounded(x, dt));
    rp.set("w", rounded(w, dt));
    rp.set("b", bias);
    const Tensor rr = rounded(r, dt);
    const TensorTree gr = autodiff::grad([&](const TensorTree& p) {
      return sum(mul(linear(p.at("x"), p.at("w"), p.at("b")), rr));
    })(rp);
    for (const char* name : {"x", "w", "b"}) {
      SCOPED_TRACE(name);
      ASSERT_EQ(g.at(name).dtype(), DType::F32);
      // The bias gradient sums the f32 cotangent: exactly the f32 one.
      if (std::string(name) == "b") {
        EXPECT_EQ(max_abs_diff(g.at(name), g32.at(name)), 0.0);
        continue;
      }
      EXPECT_LE(max_abs_diff(g.at(name), gr.at(name)), 1e-5 * max_abs(gr.at(name)) + 1e-5);
      // Relative to the f32 gradient: within bf16 (or f16) rounding of a K = 32 or 60 sum.
      const double tol =
          4.0 * std::sqrt(60.0) * (dt == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
      EXPECT_LE(max_abs_diff(g.at(name), g32.at(name)), tol * max_abs(g32.at(name)) / 4.0 + tol);
    }
  }
}

// A bf16 product's f32 cotangent goes once it is cast: the weight's f32 gradient is made
// without it (a language model's head, where the cotangent is B x T x V floats). So the
// bf16 backward peaks lower than the f32 one, which needs its f32 cotangent throughout;
// held to the end, the f32 cotangent would put the bf16 peak above it by the bf16 copy.
TEST(MatmulMixed, TheF32CotangentGoesBeforeTheWeightGradientIsMade) {
  constexpr std::int64_t n = 64, d = 512, v = 1000;
  auto backward_peak = [&](DType dtype) {
    Tensor h = make_leaf(randn({n, d}, 1)), w = make_leaf(randn({d, v}, 2));
    Tensor out = dtype == DType::F32 ? matmul(h, w) : matmul(astype(h, dtype), astype(w, dtype));
    const Tensor loss = sum(mul(out, randn({n, v}, 3)));
    out = Tensor();
    const std::int64_t live = live_bytes();
    reset_peak_bytes();
    const std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {h, w});
    EXPECT_EQ(g[1].dtype(), DType::F32);
    return peak_bytes() - live;
  };
  const std::int64_t f32 = backward_peak(DType::F32), bf16 = backward_peak(DType::BF16);
  EXPECT_LT(bf16, f32) << "bf16 " << bf16 << " bytes, f32 " << f32;
  // linear too, its bias gradient summed from the f32 cotangent first.
  auto linear_peak = [&](DType dtype) {
    Tensor h = make_leaf(randn({n, d}, 1)), w = make_leaf(randn({d, v}, 2));
    Tensor b = make_leaf(randn({v}, 4));
    Tensor out = dtype == DType::F32 ? linear(h, w, b) : linear(astype(h, dtype), astype(w, dtype), b);
    const Tensor loss = sum(mul(out, randn({n, v}, 3)));
    out = Tensor();
    const std::int64_t live = live_bytes();
    reset_peak_bytes();
    const std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {h, w, b});
    EXPECT_EQ(g[2].dtype(), DType::F32);
    return peak_bytes() - live;
  };
  const std::int64_t lf32 = linear_peak(DType::F32), lbf16 = linear_peak(DType::BF16);
  EXPECT_LT(lbf16, lf32) << "linear: bf16 " << lbf16 << " bytes, f32 " << lf32;
}

TEST(MatmulMixed, BatchedTransposedSharedBackwardMatchesRounded) {
  // The rare layout (batched A transposed, shared B) widens to f32 in the backward.
  const Tensor a = randn({3, 20, 8}, 31), b = randn({20, 12}, 32);
  TensorTree p;
  p.set("a", a);
  p.set("b", b);
  const Tensor r = randn({3, 8, 12}, 33);
  const TensorTree g = autodiff::grad([&](const TensorTree& q) {
    return sum(mul(matmul(astype(q.at("a"), DType::BF16), astype(q.at("b"), DType::BF16),
                          /*trans_a=*/true, false),
                   r));
  })(p);
  TensorTree rp;
  rp.set("a", rounded(a, DType::BF16));
  rp.set("b", rounded(b, DType::BF16));
  const Tensor rr = rounded(r, DType::BF16);
  const TensorTree gr = autodiff::grad([&](const TensorTree& q) {
    return sum(mul(matmul(q.at("a"), q.at("b"), true, false), rr));
  })(rp);
  for (const char* name : {"a", "b"})
    EXPECT_LE(max_abs_diff(g.at(name), gr.at(name)), 1e-5 * max_abs(gr.at(name))) << name;
}

// matmul and linear on the checked device give the CPU's bits, forward and backward, for
// every operand layout and compute dtype. Operands are rounded on the CPU first.
TEST(MatmulDevices, CheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  using testing::expect_same_on_checked;
  using testing::host_uniform;
  const std::vector<Case> cases = {
      {{64, 96}, {96, 48}, false, false}, {{96, 64}, {96, 48}, true, false},
      {{64, 96}, {48, 96}, false, true},  {{3, 17, 40}, {3, 40, 9}, false, false},
      {{2, 40, 17}, {2, 9, 40}, true, true}, {{4, 33, 72}, {72, 65}, false, false},
      {{3, 8, 20}, {12, 20}, false, true}};
  std::uint64_t seed = 1;
  for (const Case& c : cases)
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor a = astype(host_uniform(c.a, seed++), dt), b = astype(host_uniform(c.b, seed++), dt);
      expect_same_on_checked(to_string(c.a) + " @ " + to_string(c.b) + " " + dtype_name(dt),
                             [&c](const V& x) { return matmul(x[0], x[1], c.ta, c.tb); }, {a, b},
                             {true, true});
    }
  const Tensor x = host_uniform({5, 7, 96}, 40), w = host_uniform({96, 80}, 41);
  expect_same_on_checked(
      "linear", [](const V& in) { return linear(in[0], in[1]); }, {x, w}, {true, true});
  expect_same_on_checked(
      "linear with bias, forward", [](const V& in) { return linear(in[0], in[1], in[2]); },
      {x, w, host_uniform({80}, 42)}, {false, false, false});
}

// The batched transposed A with a shared B: its backward sums dB over the batch in one
// strided GEMM and widens reduced-precision operands to f32 (astype).
TEST(MatmulDevices, SharedBWithTransposedAGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor a = astype(testing::host_uniform({3, 20, 8}, 50), dt);
    for (bool tb : {false, true}) {
      const Tensor b = astype(testing::host_uniform(tb ? Shape{12, 20} : Shape{20, 12}, 51), dt);
      testing::expect_same_on_checked(
          std::string("A^T @ B") + (tb ? "^T " : " ") + dtype_name(dt),
          [tb](const V& x) { return matmul(x[0], x[1], true, tb); }, {a, b}, {true, true});
    }
  }
}

TEST(MatmulMixed, MixedOperandDtypesAreRejected) {
  const Tensor a = Tensor::ones({2, 2});
  EXPECT_THROW(matmul(a, astype(a, DType::BF16)), InvalidArgument);
  EXPECT_THROW(linear(astype(a, DType::F16), astype(a, DType::BF16)), InvalidArgument);
  EXPECT_THROW(matmul(Tensor::arange(4).view({2, 2}), Tensor::arange(4).view({2, 2})),
               InvalidArgument);
}

}  // namespace
}  // namespace distjax::tensor
