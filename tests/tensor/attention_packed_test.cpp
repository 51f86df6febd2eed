// attention_packed (q, k, v read in place from a fused (B, T, 3 H D) projection) against
// the reshape / permute / split / attention / permute composition it replaces: values
// and gradients, causal and not, several head counts and sequence lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::tensor {
namespace {

Tensor uniform(const Shape& shape, std::uint32_t seed) {
  std::vector<float> p(static_cast<std::size_t>(numel(shape)));
  std::uint32_t x = 2463534242u ^ (seed * 2654435761u);
  for (float& v : p) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<float>(x % 20001) / 10000.f - 1.f;
  }
  return Tensor::from_vector(p, shape);
}

Tensor composed(const Tensor& qkv, std::int64_t h, bool causal, float scale) {
  const std::int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / (3 * h);
  Tensor x = permute(reshape(qkv, {b, t, h, 3, d}), {3, 0, 2, 1, 4});
  std::vector<Tensor> parts = split(x, 3, 0);
  const Shape hs{b, h, t, d};
  Tensor y =
      attention(reshape(parts[0], hs), reshape(parts[1], hs), reshape(parts[2], hs), causal, scale);
  return reshape(permute(y, {0, 2, 1, 3}), {b, t, h * d});
}

void expect_near(const Tensor& got, const Tensor& want, float tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  for (std::int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(g[i], w[i], tol) << what << " at " << i;
}

TEST(AttentionPacked, MatchesComposedAttentionAndGradients) {
  struct Case {
    std::int64_t b, t, h, d;
    bool causal;
    float scale;
  };
  for (const Case& c : {Case{2, 7, 3, 4, true, 0.f}, Case{1, 40, 2, 8, false, 0.f},
                        Case{2, 70, 4, 16, true, 0.3f}, Case{1, 1, 1, 4, true, 0.f}}) {
    Tensor qkv = uniform({c.b, c.t, 3 * c.h * c.d}, static_cast<std::uint32_t>(c.t));
    Tensor ct = uniform({c.b, c.t, c.h * c.d}, 99);
    expect_near(attention_packed(qkv, c.h, c.causal, c.scale),
                composed(qkv, c.h, c.causal, c.scale), 1e-6f, "values");
    auto grad_of = [&](bool packed) {
      Tensor leaf = make_leaf(qkv);
      Tensor y = packed ? attention_packed(leaf, c.h, c.causal, c.scale)
                        : composed(leaf, c.h, c.causal, c.scale);
      return autodiff::grad({sum(mul(y, ct))}, {Tensor()}, {leaf})[0];
    };
    expect_near(grad_of(true), grad_of(false), 1e-5f, "gradient");
  }
}

// Attention's outputs y (packed) and z from `f` on fresh leaves of `inputs` (qkv, q, k, v),
// then the gradients of sum(y * ct) + sum(z) with respect to them: {y, z, dqkv, dq, dk, dv},
// y and z widened to f32, everything copied to the CPU.
using YZ = std::pair<Tensor, Tensor>;
std::vector<Tensor> outputs_and_grads(const std::vector<Tensor>& inputs, const Tensor& ct,
                                      const std::function<YZ(const std::vector<Tensor>&)>& f) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs)
    leaves.push_back(make_leaf(x));
  const auto [y, z] = f(leaves);
  const Tensor y32 = astype(y, DType::F32), z32 = astype(z, DType::F32);
  std::vector<Tensor> out = autodiff::grad({add(sum(mul(y32, ct)), sum(z32))}, {Tensor()}, leaves);
  out.insert(out.begin(), {y32, z32});
  for (Tensor& t : out)
    t = t.to(Device::cpu());
  return out;
}

// The compute dtype lets a device round the products' operands (a GPU's tensor cores);
// the CPU computes in f32 whatever is asked: the same bits, values and gradients.
TEST(AttentionCompute, TheCpuComputesEveryComputeDtypeInF32) {
  const Tensor qkv = uniform({2, 33, 3 * 2 * 8}, 5), ct = uniform({2, 33, 2 * 8}, 6);
  const Tensor q = uniform({2, 2, 17, 8}, 7), k = uniform({2, 2, 21, 8}, 8),
               v = uniform({2, 2, 21, 8}, 9);
  auto run = [&](DType compute) {
    return outputs_and_grads({qkv, q, k, v}, ct, [&](const std::vector<Tensor>& a) {
      return YZ{attention_packed(a[0], 2, true, 0.f, compute),
                attention(a[1], a[2], a[3], true, 0.f, compute)};
    });
  };
  const std::vector<Tensor> want = run(DType::F32);
  for (DType compute : {DType::BF16, DType::F16}) {
    const std::vector<Tensor> got = run(compute);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>())
          << dtype_name(compute) << ", output " << i;
  }
  EXPECT_THROW(attention_packed(qkv, 2, true, 0.f, DType::I32), InvalidArgument);
  EXPECT_THROW(attention(q, k, v, true, 0.f, DType::I64), InvalidArgument);
}

Tensor bf16_rounded(const Tensor& x) {
  return astype(astype(x, DType::BF16), DType::F32);
}

// The CPU's bf16 attention entries on for a scope (off by default).
struct CpuBf16Entries {
  CpuBf16Entries() { detail::cpu::set_serves_bf16_attention(true); }
  ~CpuBf16Entries() { detail::cpu::set_serves_bf16_attention(false); }
  CpuBf16Entries(const CpuBf16Entries&) = delete;
  CpuBf16Entries& operator=(const CpuBf16Entries&) = delete;
};

// The bf16 entries of the attention family (cuDNN's SDPA on CUDA; on the CPU, turned on
// here, a widening reference): a bf16 plan hands them bf16 copies of q, k, v and the
// cotangent, and widens their bf16 o and gradients. So the op computes exactly what the f32
// entries compute on bf16-rounded inputs and cotangents, rounded to bf16.
TEST(AttentionCompute, ABf16PlanRunsTheBf16EntriesOnBf16Copies) {
  const Tensor qkv = uniform({2, 33, 3 * 2 * 8}, 5), ct = uniform({2, 33, 2 * 8}, 6);
  const Tensor q = uniform({2, 2, 17, 8}, 7), k = uniform({2, 2, 21, 8}, 8),
               v = uniform({2, 2, 21, 8}, 9);
  // On the CPU, and on the checked device (every tensor the entries touch must be opened).
  auto run = [&](DType compute, bool rounded, Device dev = Device::cpu()) {
    DeviceScope scope(dev);
    auto in = [&](const Tensor& x) { return (rounded ? bf16_rounded(x) : x).to(dev); };
    return outputs_and_grads({in(qkv), in(q), in(k), in(v)}, in(ct),
                             [&](const std::vector<Tensor>& a) {
                               return YZ{attention_packed(a[0], 2, true, 0.f, compute),
                                         attention(a[1], a[2], a[3], false, 0.3f, compute)};
                             });
  };
  const std::vector<Tensor> want = run(DType::F32, true);
  std::vector<Tensor> got, got_checked;
  {
    CpuBf16Entries on;
    got = run(DType::BF16, false);
    got_checked = run(DType::BF16, false, Device{DeviceKind::Checked, 0});
  }
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got_checked[i].to_vector<float>(), got[i].to_vector<float>()) << "checked, " << i;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::vector<float> g = got[i].to_vector<float>(), w = want[i].to_vector<float>();
    ASSERT_EQ(g.size(), w.size());
    float max_w = 0.f, worst = 0.f;
    for (float x : w)
      max_w = std::max(max_w, std::fabs(x));
    for (std::size_t j = 0; j < g.size(); ++j) {
      std::uint32_t bits;
      std::memcpy(&bits, &g[j], 4);
      ASSERT_EQ(bits & 0xffffu, 0u) << "output " << i << " at " << j << " is not a bf16 value";
      worst = std::max(worst, std::fabs(g[j] - w[j]) / max_w);
      // The outputs: one bf16 rounding of the f32 result, half a unit in the last place
      // (<= 2^-8 relative). The gradients also see o rounded to bf16 (in rowsum(dO * O)):
      // within 2^-8 of their largest value.
      const float tol = i < 2 ? std::ldexp(std::fabs(w[j]), -8) + 1e-7f : std::ldexp(max_w, -8);
      ASSERT_LE(std::fabs(g[j] - w[j]), tol) << "output " << i << " at " << j;
    }
    std::printf("output %zu: largest difference %.3g x max|value|\n", i, worst);
  }
  // Without them (the default), the CPU computes bf16 plans with the f32 entries.
  EXPECT_EQ(run(DType::BF16, false)[0].to_vector<float>(),
            run(DType::F32, false)[0].to_vector<float>());
}

// `out`: the output in the dtype its next matmul reads, the same bits as casting the f32
// output (and the same gradients), with the f32 entries and with the bf16 ones (whose bf16
// output is then handed over as it is).
TEST(AttentionCompute, AnOutputDtypeIsTheCastOfTheF32Output) {
  const Tensor qkv = uniform({2, 9, 3 * 2 * 8}, 11), ct = uniform({2, 9, 2 * 8}, 12);
  const Tensor q = uniform({1, 2, 9, 8}, 13), k = uniform({1, 2, 9, 8}, 14),
               v = uniform({1, 2, 9, 8}, 15);
  auto run = [&](DType out) {
    return outputs_and_grads({qkv, q, k, v}, ct, [&](const std::vector<Tensor>& a) {
      Tensor y = attention_packed(a[0], 2, true, 0.f, DType::BF16, out);
      Tensor z = attention(a[1], a[2], a[3], true, 0.f, DType::BF16, out);
      if (out == DType::F32) y = astype(y, DType::BF16), z = astype(z, DType::BF16);
      EXPECT_EQ(y.dtype(), DType::BF16);
      EXPECT_EQ(z.dtype(), DType::BF16);
      return YZ{y, z};
    });
  };
  for (bool entries : {false, true}) {
    SCOPED_TRACE(entries ? "bf16 entries" : "f32 entries");
    std::optional<CpuBf16Entries> on;
    if (entries) on.emplace();
    const std::vector<Tensor> want = run(DType::F32), got = run(DType::BF16);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>()) << "output " << i;
  }
  EXPECT_THROW(attention_packed(qkv, 2, true, 0.f, DType::BF16, DType::I32), InvalidArgument);
  EXPECT_THROW(attention(q, k, v, true, 0.f, DType::F32, DType::I64), InvalidArgument);
}

// A projection written in bf16 (what nn::MultiHeadAttention asks of its QKV projection where
// attention_packed_input_dtype says bf16): the bf16 entries read it as it is and hand its
// cotangent back in bf16, with the values of an f32 projection rounded to bf16; without them
// the f32 entries widen it.
TEST(AttentionCompute, ABf16ProjectionIsReadAsItIsWithItsCotangentInBf16) {
  const Tensor qkv = uniform({2, 33, 3 * 2 * 8}, 21), ct = uniform({2, 33, 2 * 8}, 22);
  const Tensor qkv16 = astype(qkv, DType::BF16);
  const Shape shape = qkv.shape();
  auto run = [&](const Tensor& x) {
    return outputs_and_grads({x, qkv, qkv, qkv}, ct, [&](const std::vector<Tensor>& a) {
      return YZ{attention_packed(a[0], 2, true, 0.f, DType::BF16, DType::BF16), Tensor::zeros({1})};
    });
  };
  for (bool entries : {false, true}) {
    SCOPED_TRACE(entries ? "bf16 entries" : "f32 entries");
    std::optional<CpuBf16Entries> on;
    if (entries) on.emplace();
    EXPECT_EQ(attention_packed_input_dtype(shape, 2, true, DType::BF16, Device::cpu()),
              entries ? DType::BF16 : DType::F32);
    EXPECT_EQ(attention_packed_input_dtype(shape, 2, true, DType::F32, Device::cpu()), DType::F32);
    const std::vector<Tensor> got = run(qkv16), want = run(astype(qkv16, DType::F32));
    // The cotangent of the bf16 projection comes in its dtype.
    EXPECT_EQ(got[2].dtype(), DType::BF16);
    EXPECT_EQ(got[0].to_vector<float>(), want[0].to_vector<float>());
    EXPECT_EQ(astype(got[2], DType::F32).to_vector<float>(),
              astype(astype(want[2], DType::BF16), DType::F32).to_vector<float>());
  }
  EXPECT_THROW(attention_packed(astype(qkv, DType::F16), 2, true, 0.f, DType::BF16),
               InvalidArgument);
}

TEST(AttentionPacked, RejectsBadShapes) {
  EXPECT_THROW(attention_packed(uniform({2, 3, 10}, 1), 2), InvalidArgument);  // 10 % 6 != 0
  EXPECT_THROW(attention_packed(uniform({2, 12}, 1), 2), InvalidArgument);
}

}  // namespace
}  // namespace distjax::tensor
