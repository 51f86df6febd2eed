// linear with an epilogue (GELU, an output in the operands' dtype): the forward is the
// composed ops' (linear in f32, gelu, astype) bit for bit, and the backward is the chain rule
// through the kept pre-activation P rounded to the output dtype: d = g * gelu'(P), the bias
// gradient its column sums, dx and dW the GEMMs of d rounded to the operands' dtype, with
// the cotangent arriving in f32 or in the output dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "checked_parity.hpp"
#include "test_tensors.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"

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
// in the output's dtype (through astype) and one that comes in f32 (through a bf16 product).
TEST(LinearEpilogue, BackwardIsTheChainRuleThroughTheKeptPreActivation) {
  const Tensor x = randn({4, 9, 64}, 11), w = randn({64, 48}, 12), b = randn({48}, 13);
  const Tensor r = randn({4, 9, 48}, 14);  // the loss's weights: sum(y * r)
  const Tensor v = randn({48, 24}, 15), r2 = randn({4, 9, 24}, 16);
  for (const Config& c : configs())
    for (bool f32_cotangent : {false, true}) {
      if (f32_cotangent && c.out == DType::F32) continue;
      SCOPED_TRACE(c.str() + (f32_cotangent ? ", f32 cotangent" : ""));
      TensorTree params;
      params.set("x", x);
      params.set("w", w);
      if (c.bias) params.set("b", b);
      const Tensor vc = astype(v, c.out);
      const TensorTree g = autodiff::grad([&](const TensorTree& p) {
        const Tensor y = linear(astype(p.at("x"), c.operands), astype(p.at("w"), c.operands),
                                c.bias ? p.at("b") : Tensor(), {.gelu = c.gelu, .out = c.out});
        // A bf16 product hands y an f32 cotangent; astype hands it one in y's dtype.
        if (f32_cotangent) return sum(mul(matmul(y, vc), r2));
        return sum(mul(astype(y, DType::F32), r));
      })(params);

      // The chain rule with the ops, on the rounded values the op works with.
      NoGradGuard off;
      const Tensor xc = astype(x, c.operands), wc = astype(w, c.operands);
      // The cotangent of y: r rounded to y's dtype, or the f32 product dy = r2 v^T in bf16.
      const Tensor gy =
          f32_cotangent ? matmul(astype(r2, c.out), vc, false, true) : rounded(r, c.out);
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
      if (c.bias) EXPECT_LE(max_abs_diff(g.at("b"), sum(d2, {0})), 1e-6 * max_abs(sum(d2, {0})));
      ASSERT_EQ(g.at("x").dtype(), DType::F32);
    }
}

TEST(LinearEpilogue, OnTheCheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  const Tensor x = testing::host_uniform({3, 11, 40}, 21), w = testing::host_uniform({40, 24}, 22);
  const Tensor b = testing::host_uniform({24}, 23);
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
