// linear with an epilogue (GELU, an output in the operands' dtype): the forward is the
// composed ops' (linear in f32, gelu, astype) bit for bit, and the backward is the chain rule
// through the kept pre-activation P rounded to the output dtype: d = g * gelu'(P), the bias
// gradient its column sums, dx and dW the GEMMs of d rounded to the operands' dtype, with
// the cotangent arriving in f32 or in the output dtype. gelu_mlp (two linears as one op) is
// their forward bit for bit, and its backward the chain rule with the hidden cotangent kept
// in f32 up to GELU's derivative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "checked_parity.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "test_tensors.hpp"

namespace distjax::tensor {
namespace {

using testing::randn;
using testing::rounded;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> va = astype(a, DType::F32).to_vector<float>();
  const std::vector<float> vb = astype(b, DType::F32).to_vector<float>();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i)
    m = std::max(m, std::abs(double(va[i]) - double(vb[i])));
  return m;
}

// What consumes the linear's output y in the backward test.
enum class Consumer { Astype, Matmul, Linear };

struct Config {
  DType operands;  // f32, bf16 or f16
  DType out;       // f32 or the operands'
  bool gelu, bias;
  std::string str() const {
    return std::string(dtype_name(operands)) + " operands, " + dtype_name(out) + " out" +
           (gelu ? ", gelu" : "") + (bias ? ", bias" : "");
  }
};

// f32 operands writing f32; bf16 operands writing f32 or bf16; f16 writing f16; each with
// and without GELU and a bias.
std::vector<Config> configs() {
  std::vector<Config> all;
  for (const auto& [operands, out] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::F32},
        std::pair{DType::BF16, DType::BF16}})
    for (bool gelu : {false, true})
      for (bool bias : {false, true})
        all.push_back({operands, out, gelu, bias});
  return all;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (float v : astype(a, DType::F32).to_vector<float>())
    m = std::max(m, std::abs(double(v)));
  return m;
}

TEST(LinearEpilogue, ForwardIsTheComposedOpsBitForBit) {
  const Tensor x = randn({5, 7, 96}, 1), w = randn({96, 80}, 2), b = randn({80}, 3);
  for (const Config& c : configs()) {
    SCOPED_TRACE(c.str());
    const Tensor xc = astype(x, c.operands), wc = astype(w, c.operands);
    const Tensor bias = c.bias ? b : Tensor();
    const Tensor got = linear(xc, wc, bias, {.gelu = c.gelu, .out = c.out});
    ASSERT_EQ(got.dtype(), c.out);
    Tensor want = linear(xc, wc, bias);
    if (c.gelu) want = gelu(want, true);
    want = astype(want, c.out);
    EXPECT_TRUE(testing::same_bits(got.to(Device::cpu()), want.to(Device::cpu())));
  }
}

// The backward against the chain rule written out with the ops, for a cotangent that comes
// in the output's dtype (through astype, or as the dX a linear writes in the dtype of an
// input whose producer takes it so) and one that comes in f32 (through a bf16 product).
TEST(LinearEpilogue, BackwardIsTheChainRuleThroughTheKeptPreActivation) {
  const Tensor x = randn({4, 9, 64}, 11), w = randn({64, 48}, 12), b = randn({48}, 13);
  const Tensor r = randn({4, 9, 48}, 14);  // the loss's weights: sum(y * r)
  const Tensor v = randn({48, 24}, 15), r2 = randn({4, 9, 24}, 16);
  for (const Config& c : configs())
    for (Consumer consumer : {Consumer::Astype, Consumer::Matmul, Consumer::Linear}) {
      if (consumer != Consumer::Astype && c.out == DType::F32) continue;
      SCOPED_TRACE(c.str() + (consumer == Consumer::Matmul   ? ", through a product"
                              : consumer == Consumer::Linear ? ", through a linear"
                                                             : ""));
      TensorTree params;
      params.set("x", x);
      params.set("w", w);
      if (c.bias) params.set("b", b);
      const Tensor vc = astype(v, c.out);
      const TensorTree g = autodiff::grad([&](const TensorTree& p) {
        const Tensor y = linear(astype(p.at("x"), c.operands), astype(p.at("w"), c.operands),
                                c.bias ? p.at("b") : Tensor(), {.gelu = c.gelu, .out = c.out});
        // A bf16 product hands y an f32 cotangent; astype hands it one in y's dtype, and so
        // does a linear, whose dX takes the dtype of an input from a linear writing it.
        if (consumer == Consumer::Matmul) return sum(mul(matmul(y, vc), r2));
        if (consumer == Consumer::Linear) return sum(mul(linear(y, vc), r2));
        return sum(mul(astype(y, DType::F32), r));
      })(params);

      // The chain rule with the ops, on the rounded values the op works with.
      NoGradGuard off;
      const Tensor xc = astype(x, c.operands), wc = astype(w, c.operands);
      // The cotangent of y: r rounded to y's dtype, or the product dy = r2 v^T in bf16
      // operands, f32 (a matmul's) or rounded to y's dtype (a linear's).
      const Tensor dy = matmul(astype(r2, c.out), vc, false, true);
      const Tensor gy = consumer == Consumer::Matmul   ? dy
                        : consumer == Consumer::Linear ? rounded(dy, c.out)
                                                       : rounded(r, c.out);
      Tensor d = gy;
      if (c.gelu) {
        const Tensor pre = rounded(linear(xc, wc, c.bias ? b : Tensor()), c.out);
        d = autodiff::grad(
                [&](const TensorTree& p) { return sum(mul(gelu(p.at("p"), true), gy)); })([&] {
              TensorTree t;
              t.set("p", pre);
              return t;
            }())
                .at("p");
      }
      const Tensor d2 = d.view({36, 48});
      const Tensor dc = astype(d2, c.operands);
      const Tensor want_x = matmul(dc, wc, false, true).view({4, 9, 64});
      const Tensor want_w = matmul(xc.view({36, 64}), dc, true, false);
      // The same ops in the same order: equal up to f32 rounding (1e-6 relative).
      EXPECT_LE(max_abs_diff(g.at("x"), want_x), 1e-6 * max_abs(want_x));
      EXPECT_LE(max_abs_diff(g.at("w"), want_w), 1e-6 * max_abs(want_w));
      if (c.bias) {
        EXPECT_LE(max_abs_diff(g.at("b"), sum(d2, {0})), 1e-6 * max_abs(sum(d2, {0})));
      }
      ASSERT_EQ(g.at("x").dtype(), DType::F32);
    }
}

// A bf16 output read by two linears gets two bf16 cotangents: the tape widens them and sums
// in f32.
TEST(LinearEpilogue, TwoBf16CotangentsAreSummedInF32) {
  const Tensor x = randn({6, 32}, 41), w = randn({32, 16}, 42);
  const Tensor v1 = astype(randn({16, 8}, 43), DType::BF16),
               v2 = astype(randn({16, 8}, 44), DType::BF16);
  const Tensor r1 = randn({6, 8}, 45), r2 = randn({6, 8}, 46);
  TensorTree params;
  params.set("w", w);
  const Tensor x16 = astype(x, DType::BF16);
  const TensorTree g = autodiff::grad([&](const TensorTree& p) {
    const Tensor y = linear(x16, astype(p.at("w"), DType::BF16), Tensor(), {.out = DType::BF16});
    return add(sum(mul(linear(y, v1), r1)), sum(mul(linear(y, v2), r2)));
  })(params);
  NoGradGuard off;
  const Tensor dy1 = rounded(matmul(astype(r1, DType::BF16), v1, false, true), DType::BF16);
  const Tensor dy2 = rounded(matmul(astype(r2, DType::BF16), v2, false, true), DType::BF16);
  const Tensor dy = astype(add(dy1, dy2), DType::BF16);  // linear's backward rounds it
  const Tensor want = matmul(x16, dy, true, false);
  ASSERT_EQ(g.at("w").dtype(), DType::F32);
  EXPECT_LE(max_abs_diff(g.at("w"), want), 1e-6 * max_abs(want));
}

// A residual added in the product: the bits of add(residual, linear(...)), forward and
// backward (the residual's cotangent is the output's), for f32 and bf16 operands.
TEST(LinearEpilogue, AResidualIsTheAddBitForBit) {
  const Tensor x = randn({3, 5, 24}, 51), w = randn({24, 16}, 52), b = randn({16}, 53);
  const Tensor res = randn({3, 5, 16}, 54), r = randn({3, 5, 16}, 55);
  for (DType operands : {DType::F32, DType::BF16})
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(operands)) + (bias ? ", bias" : ""));
      auto run = [&](bool fused) {
        TensorTree params;
        params.set("x", x);
        params.set("w", w);
        params.set("b", b);
        params.set("res", res);
        Tensor out;
        const TensorTree g = autodiff::grad([&](const TensorTree& p) {
          const Tensor xc = astype(p.at("x"), operands), wc = astype(p.at("w"), operands);
          const Tensor bb = bias ? p.at("b") : Tensor();
          out = fused ? linear(xc, wc, bb, {.residual = p.at("res")})
                      : add(p.at("res"), linear(xc, wc, bb));
          return sum(mul(out, r));
        })(params);
        std::vector<Tensor> all{out.detach()};
        for (const char* name : {"x", "w", "b", "res"})
          all.push_back(g.at(name));
        return all;
      };
      const std::vector<Tensor> got = run(true), want = run(false);
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (i == 3 && !bias) continue;  // no bias: its gradient is zero either way
        EXPECT_TRUE(testing::same_bits(got[i].to(Device::cpu()), want[i].to(Device::cpu())))
            << (i == 0 ? "output" : "gradient " + std::to_string(i - 1));
      }
    }
  EXPECT_THROW(linear(x, w, b, {.gelu = true, .residual = res}), InvalidArgument);
  EXPECT_THROW(linear(astype(x, DType::BF16), astype(w, DType::BF16), b,
                      {.out = DType::BF16, .residual = res}),
               InvalidArgument);
  EXPECT_THROW(linear(x, w, b, {.residual = randn({3, 16}, 56)}), InvalidArgument);
}

TEST(LinearEpilogue, OnTheCheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  const Tensor x = testing::host_uniform({3, 11, 40}, 21), w = testing::host_uniform({40, 24}, 22);
  const Tensor b = testing::host_uniform({24}, 23);
  testing::expect_same_on_checked(
      "residual", [](const V& in) { return linear(in[0], in[1], in[2], {.residual = in[3]}); },
      {x, w, b, testing::host_uniform({3, 11, 24}, 24)}, {true, true, true, true});
  for (const Config& c : configs()) {
    testing::expect_same_on_checked(
        c.str(),
        [c](const V& in) {
          const Tensor y = linear(astype(in[0], c.operands), astype(in[1], c.operands),
                                  c.bias ? in[2] : Tensor(), {.gelu = c.gelu, .out = c.out});
          return astype(y, DType::F32);
        },
        {x, w, b}, {true, true, c.bias});
  }
}

// gelu_mlp's inputs, by name (x, w1, b1, w2, b2, residual), and its value under a
// configuration: f32 or bf16 operands, with or without biases and a residual.
struct MlpCase {
  DType operands;
  bool bias, residual;
  std::string str() const {
    return std::string(dtype_name(operands)) + (bias ? ", biases" : "") +
           (residual ? ", residual" : "");
  }
};
std::vector<MlpCase> mlp_cases() {
  std::vector<MlpCase> all;
  for (DType t : {DType::F32, DType::BF16})
    for (bool bias : {false, true})
      for (bool residual : {false, true})
        all.push_back({t, bias, residual});
  return all;
}
TensorTree mlp_inputs() {
  TensorTree p;
  p.set("x", randn({3, 10, 40}, 61));
  p.set("w1", randn({40, 64}, 62));
  p.set("b1", randn({64}, 63));
  p.set("w2", randn({64, 24}, 64));
  p.set("b2", randn({24}, 65));
  p.set("residual", randn({3, 10, 24}, 66));
  return p;
}
// sum(mlp(p) * r): the MLP as one op (fused) or as the two linears.
Tensor mlp_loss(const TensorTree& p, const MlpCase& c, bool fused, const Tensor& r) {
  const Tensor x = astype(p.at("x"), c.operands), w1 = astype(p.at("w1"), c.operands),
               w2 = astype(p.at("w2"), c.operands);
  const Tensor b1 = c.bias ? p.at("b1") : Tensor(), b2 = c.bias ? p.at("b2") : Tensor();
  const Tensor res = c.residual ? p.at("residual") : Tensor();
  const Tensor y = fused ? gelu_mlp(x, w1, b1, w2, b2, res)
                         : linear(linear(x, w1, b1, {.gelu = true, .out = c.operands}), w2, b2,
                                  {.residual = res});
  return sum(mul(y, r));
}

// The forward is the two linears' bit for bit; in f32 so is every gradient (the same
// products and passes, in the same order).
TEST(GeluMlp, IsTheTwoLinearsBitForBitInF32) {
  const TensorTree p = mlp_inputs();
  const Tensor r = randn({3, 10, 24}, 67);
  for (const MlpCase& c : mlp_cases()) {
    SCOPED_TRACE(c.str());
    {
      NoGradGuard off;
      EXPECT_EQ(mlp_loss(p, c, true, r).item<float>(), mlp_loss(p, c, false, r).item<float>());
    }
    if (c.operands != DType::F32) continue;
    const TensorTree got =
        autodiff::grad([&](const TensorTree& q) { return mlp_loss(q, c, true, r); })(p);
    const TensorTree want =
        autodiff::grad([&](const TensorTree& q) { return mlp_loss(q, c, false, r); })(p);
    for (const auto& [name, g] : want) {
      SCOPED_TRACE(name);
      EXPECT_EQ(got.at(name).to_vector<float>(), g.to_vector<float>());
    }
  }
}

// In bf16 the backward applies GELU's derivative to fc2's f32 dX product (the two linears
// round it to bf16 first): d = rounded(dA * gelu'(P)) with dA = g2 w2^T in f32, fc1's bias
// gradient d's column sums before rounding, dx and dW1 the products of d.
TEST(GeluMlp, Bf16BackwardKeepsTheHiddenCotangentInF32UpToTheDerivative) {
  const TensorTree p = mlp_inputs();
  const Tensor r = randn({3, 10, 24}, 68);
  const MlpCase c{DType::BF16, true, true};
  const TensorTree got =
      autodiff::grad([&](const TensorTree& q) { return mlp_loss(q, c, true, r); })(p);
  NoGradGuard off;
  const DType bf = DType::BF16;
  const Tensor x = astype(p.at("x"), bf).view({30, 40}), w1 = astype(p.at("w1"), bf),
               w2 = astype(p.at("w2"), bf);
  const Tensor p32 = linear(x, w1, p.at("b1"));  // fc1's f32 sum
  const Tensor pre = rounded(p32, bf), a = astype(gelu(p32, true), bf);
  const Tensor g2 = astype(r.view({30, 24}), bf);  // fc2's cotangent, rounded for its products
  const Tensor da = matmul(g2, w2, false, true);   // (30, 64) f32
  const Tensor d32 =
      autodiff::grad([&](const TensorTree& t) { return sum(mul(gelu(t.at("p"), true), da)); })([&] {
        TensorTree t;
        t.set("p", pre);
        return t;
      }())
          .at("p");
  const Tensor d = astype(d32, bf);
  auto expect_near = [](const Tensor& got, const Tensor& want, const char* what) {
    EXPECT_LE(max_abs_diff(got, want), 1e-6 * max_abs(want)) << what;
  };
  expect_near(got.at("x"), matmul(d, w1, false, true).view({3, 10, 40}), "dx");
  expect_near(got.at("w1"), matmul(x, d, true, false), "dw1");
  expect_near(got.at("b1"), sum(d32, {0}), "db1");
  expect_near(got.at("w2"), matmul(a, g2, true, false), "dw2");
  expect_near(got.at("b2"), sum(r.view({30, 24}), {0}), "db2");
  EXPECT_EQ(got.at("residual").to_vector<float>(), r.to_vector<float>());
}

TEST(GeluMlp, OnTheCheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  const TensorTree p = mlp_inputs();
  for (DType t : {DType::F32, DType::BF16})
    testing::expect_same_on_checked(
        dtype_name(t),
        [t](const V& in) {
          return gelu_mlp(astype(in[0], t), astype(in[1], t), in[2], astype(in[3], t), in[4],
                          in[5]);
        },
        {p.at("x"), p.at("w1"), p.at("b1"), p.at("w2"), p.at("b2"), p.at("residual")},
        {true, true, true, true, true, true});
  // The two linears' argument checks.
  EXPECT_THROW(gelu_mlp(p.at("x"), p.at("w2"), Tensor(), p.at("w2"), Tensor()), InvalidArgument);
  EXPECT_THROW(gelu_mlp(p.at("x"), p.at("w1"), Tensor(), p.at("w1"), Tensor()), InvalidArgument);
}

TEST(LinearEpilogue, WritesF32OrItsOperandsDtype) {
  const Tensor x = astype(randn({4, 8}, 31), DType::BF16),
               w = astype(randn({8, 8}, 32), DType::BF16);
  EXPECT_THROW(linear(x, w, Tensor(), {.out = DType::F16}), InvalidArgument);
  EXPECT_THROW(linear(astype(x, DType::F32), astype(w, DType::F32), Tensor(), {.out = DType::BF16}),
               InvalidArgument);
  EXPECT_EQ(linear(x, w, Tensor(), {.out = DType::BF16}).dtype(), DType::BF16);
}

}  // namespace
}  // namespace distjax::tensor
