// The op harness of the CUDA backend (label "gpu"): every op of the kernel table but the
// products (cuda_gemm_ops_test.cpp), forward and backward, on the GPU against the CPU on the
// same fresh random inputs, with op_harness.hpp's poisoning and tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "distjax/distjax.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/tensor/parallel_ops.hpp"
#include "distjax/tensor/update_ops.hpp"
#include "gpu/op_harness.hpp"

namespace {

using namespace distjax;
using namespace distjax::tensor;
using namespace distjax::testing::gpu_ops;

// Lambdas copy a structured binding by an init-capture ([f = f]): clang before 16 cannot
// capture a binding by name.
TEST(CudaOps, UnaryForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> any = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"gelu erf", [](const Tensor& x) { return gelu(x, false); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"add_scalar", [](const Tensor& x) { return add_scalar(x, 0.75); }},
      {"mul_scalar", [](const Tensor& x) { return mul_scalar(x, -1.5); }},
      {"pow 3", [](const Tensor& x) { return pow_scalar(x, 3.0); }},
      {"pow 1", [](const Tensor& x) { return pow_scalar(x, 1.0); }},
  };
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> positive = {
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"pow -1", [](const Tensor& x) { return pow_scalar(x, -1.0); }},
      {"pow 2.5", [](const Tensor& x) { return pow_scalar(x, 2.5); }},
      {"pow 0.5", [](const Tensor& x) { return pow_scalar(x, 0.5); }},
  };
  // An odd size (tails of vector access) and one over a million elements.
  for (const Shape& shape : {Shape{37, 129}, Shape{(1 << 20) + 3}}) {
    for (const auto& [name, f] : any)
      expect_close(name, [f = f](const V& a) { return f(a[0]); }, {uniform(shape, -3.f, 3.f)},
                   {true});
    for (const auto& [name, f] : positive)
      expect_close(name, [f = f](const V& a) { return f(a[0]); }, {uniform(shape, 0.1f, 4.f)},
                   {true});
  }
}

TEST(CudaOps, BinaryWithEveryBroadcastKind) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{64, 100}, {64, 100}},  // same
      {{64, 100}, {}},         // scalar
      {{64, 100}, {100}},      // row
      {{64, 100}, {64, 1}},    // column
      {{4, 1, 5}, {1, 3, 5}},  // general, both broadcast
      {{1001}, {1001}},        // odd length
  };
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>>
      ops = {{"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
             {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
             {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
             {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
             {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }}};
  for (const auto& [sa, sb] : shapes)
    for (const auto& [name, f] : ops) {
      // Divisors away from zero.
      Tensor b = name == "div" ? uniform(sb, 0.5f, 2.f) : uniform(sb);
      expect_close(name + " " + to_string(sa) + " " + to_string(sb),
                   [f = f](const V& a) { return f(a[0], a[1]); }, {uniform(sa), b}, {true, true});
    }
}

TEST(CudaOps, WhereAndConversions) {
  SKIP_WITHOUT_GPU();
  std::vector<float> mask(50 * 70);
  for (std::size_t i = 0; i < mask.size(); ++i)
    mask[i] = (i * 13) % 3 == 0 ? 1.f : 0.f;
  const Tensor cond = Tensor::from_vector(mask, {50, 70}, Device::cpu());
  expect_close("where", [](const V& a) { return where(a[0], a[1], a[2]); },
               {cond, uniform({50, 70}), uniform({50, 70})}, {false, true, true});
  for (DType dt : {DType::BF16, DType::F16, DType::I32, DType::I64, DType::F32})
    expect_close(std::string("astype f32 to ") + dtype_name(dt),
                 [dt](const V& a) { return astype(a[0], dt); }, {uniform({1000, 3}, -50.f, 50.f)},
                 {false});
  expect_close("astype bf16 to f32",
               [](const V& a) { return astype(astype(a[0], DType::BF16), DType::F32); },
               {uniform({333})}, {true});
  expect_close("zeros and full",
               [](const V& a) {
                 return add(add(a[0], Tensor::zeros(a[0].shape())),
                            Tensor::full(a[0].shape(), 2.5f));
               },
               {uniform({1025})}, {true});
}

TEST(CudaOps, Reductions) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{8, 300, 5}, {1}},     {{8, 300, 5}, {2}}, {{8, 300, 5}, {0, 2}},
      {{1000, 3}, {0}},       {{3, 100000}, {1}}, {{3, 100000}, {0}},
      {{2, 3, 4, 5}, {1, 3}}, {{4096, 768}, {0}}, {{7}, {0}},
  };
  for (const auto& [shape, axes] : cases) {
    const std::string s = to_string(shape) + " axes " + std::to_string(axes[0]) +
                          (axes.size() > 1 ? "," + std::to_string(axes[1]) : "");
    expect_close("sum " + s, [axes = axes](const V& a) { return sum(a[0], axes); },
                 {uniform(shape)}, {true});
    expect_close("mean " + s, [axes = axes](const V& a) { return mean(a[0], axes, true); },
                 {uniform(shape)}, {true});
    expect_close("max " + s, [axes = axes](const V& a) { return max(a[0], axes); },
                 {uniform(shape)}, {true});
  }
  expect_close("sum of all", [](const V& a) { return sum(a[0]); }, {uniform({513, 257})}, {true});
  expect_close("max of all", [](const V& a) { return max(a[0]); }, {uniform({513, 257})}, {true});
  // Ties: the first maximum gets the gradient, and argmax names the first.
  std::vector<float> tied(600);
  for (std::size_t i = 0; i < tied.size(); ++i)
    tied[i] = static_cast<float>((i * 7) % 5);
  const Tensor t = Tensor::from_vector(tied, {20, 30}, Device::cpu());
  expect_close("max with ties", [](const V& a) { return max(a[0], {1}); }, {t}, {true});
  expect_close("max of all with ties", [](const V& a) { return max(a[0], {0, 1}); }, {t}, {true});
  for (int axis : {0, 1})
    expect_close("argmax with ties axis " + std::to_string(axis),
                 [axis](const V& a) { return argmax(a[0], axis); }, {t}, {false});
  expect_close("argmax", [](const V& a) { return argmax(a[0], -1); }, {uniform({64, 50304})},
               {false});
  expect_close("sum_to",
               [](const V& a) {
                 return sum_to(a[0], {1, 30});
               },
               {uniform({20, 30})}, {true});
}

TEST(CudaOps, ShapeOps) {
  SKIP_WITHOUT_GPU();
  for (const std::vector<int>& perm :
       {std::vector<int>{0, 2, 1, 3}, {3, 1, 0, 2}, {1, 0}, {0, 1, 2, 3}}) {
    const Shape shape = perm.size() == 2 ? Shape{129, 67} : Shape{2, 35, 3, 17};
    expect_close("permute", [perm](const V& a) { return permute(a[0], perm); }, {uniform(shape)},
                 {true});
  }
  expect_close("transpose of a large matrix",
               [](const V& a) {
                 return permute(a[0], {1, 0});
               },
               {uniform({1024, 768})}, {true});
  expect_close("permute of bf16",
               [](const V& a) {
                 return astype(permute(astype(a[0], DType::BF16), {2, 0, 1}), DType::F32);
               },
               {uniform({5, 6, 7})}, {true});
  expect_close("slice", [](const V& a) { return slice(a[0], 1, 3, 40); }, {uniform({6, 50, 7})},
               {true});
  expect_close("concat",
               [](const V& a) {
                 return concat({a[0], a[1]}, 1);
               },
               {uniform({6, 5, 7}), uniform({6, 9, 7})}, {true, true});
  expect_close("split", [](const V& a) { return mul(split(a[0], 3, 2)[1], split(a[0], 3, 2)[2]); },
               {uniform({4, 5, 12})}, {true});
  expect_close("broadcast_to",
               [](const V& a) {
                 return broadcast_to(a[0], {4, 6, 5});
               },
               {uniform({6, 1})}, {true});
}

TEST(CudaOps, RowOps) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{96, 1000}, Shape{3, 7}, Shape{4, 50304}, Shape{2048, 768}}) {
    const std::string s = to_string(shape);
    const std::int64_t c = shape.back();
    for (bool lf : {false, true})
      expect_close((lf ? "log_softmax " : "softmax ") + s,
                   [lf](const V& a) { return lf ? log_softmax(a[0]) : softmax(a[0]); },
                   {uniform(shape, -4.f, 4.f)}, {true});
    expect_close("layer_norm " + s, [](const V& a) { return layer_norm(a[0], a[1], a[2]); },
                 {uniform(shape), uniform({c}), uniform({c})}, {true, true, true});
    expect_close("layer_norm without beta " + s,
                 [](const V& a) { return layer_norm(a[0], a[1], Tensor()); },
                 {uniform(shape), uniform({c})}, {true, true});
    expect_close("layer_norm, x constant " + s,
                 [](const V& a) { return layer_norm(a[0], a[1], a[2]); },
                 {uniform(shape), uniform({c}), uniform({c})}, {false, true, true});
    expect_close("rms_norm " + s, [](const V& a) { return rms_norm(a[0], a[1]); },
                 {uniform(shape), uniform({c})}, {true, true});
    // x also feeds a later op (a residual connection): the norm's backward adds x's
    // cotangent into the one summed so far, in its kernel (Node::backward_adding).
    expect_close("layer_norm after a residual " + s,
                 [](const V& a) {
                   const Tensor y = layer_norm(a[0], a[1], a[2]);
                   return add(y, mul(a[0], a[3]));
                 },
                 {uniform(shape), uniform({c}), uniform({c}), uniform(shape)},
                 {true, true, true, true});
  }
}

// The kernels that write bf16 for the next matmul (layer_norm_bf16, unary_bf16, and the
// attention's bf16 output): on the GPU, the same bits as the f32 kernels' output cast to
// bf16; against the CPU, and through their backward, at kBf16.
TEST(CudaOps, Bf16WritingKernelsAreTheCastOfTheF32Ones) {
  SKIP_WITHOUT_GPU();
  auto same = [](const std::string& what, const std::function<Tensor(DType)>& f) {
    SCOPED_TRACE(what);
    DeviceScope gpu(kGpu);
    const Tensor fused = f(DType::BF16).to(Device::cpu());
    const Tensor cast = astype(f(DType::F32), DType::BF16).to(Device::cpu());
    EXPECT_TRUE(distjax::testing::same_bits(fused, cast));
  };
  for (const Shape& shape : {Shape{37, 129}, Shape{2048, 768}, Shape{3, 7}}) {
    const std::string s = to_string(shape);
    const std::int64_t c = shape.back();
    const Tensor x = uniform(shape, -3.f, 3.f), g = uniform({c}), b = uniform({c});
    same("layer_norm " + s,
         [&](DType out) { return layer_norm(x.to(kGpu), g.to(kGpu), b.to(kGpu), 1e-5f, out); });
    same("layer_norm without beta " + s,
         [&](DType out) { return layer_norm(x.to(kGpu), g.to(kGpu), Tensor(), 1e-5f, out); });
    for (bool approximate : {true, false})
      same("gelu " + s, [&](DType out) { return gelu(x.to(kGpu), approximate, out); });
    expect_close(
        "layer_norm to bf16 " + s,
        [](const V& a) {
          return astype(layer_norm(a[0], a[1], a[2], 1e-5f, DType::BF16), DType::F32);
        },
        {x, g, b}, {true, true, true}, kBf16);
    expect_close(
        "gelu to bf16 " + s,
        [](const V& a) { return astype(gelu(a[0], true, DType::BF16), DType::F32); }, {x}, {true},
        kBf16);
    // Read by a bf16 linear, whose dX comes back in bf16 (layer_norm_backward_bf16).
    expect_close(
        "layer_norm to bf16 into a linear " + s,
        [](const V& a) {
          return linear(layer_norm(a[0], a[1], a[2], 1e-5f, DType::BF16),
                        astype(a[3], DType::BF16));
        },
        {x, g, b, uniform({c, 16})}, {true, true, true, true}, kBf16);
  }
  const Tensor qkv = uniform({2, 256, 3 * 768});
  same("attention_packed",
       [&](DType out) { return attention_packed(qkv.to(kGpu), 12, true, 0.f, DType::BF16, out); });
}

TEST(CudaOps, EmbeddingAndCrossEntropy) {
  SKIP_WITHOUT_GPU();
  for (const auto& [n, v, c] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {96, 1000, 64}, {4096, 50304, 768}, {5, 3, 7}}) {
    std::vector<std::int32_t> l32(static_cast<std::size_t>(n));
    std::vector<std::int64_t> l64(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r)
      l32[static_cast<std::size_t>(r)] =
          static_cast<std::int32_t>(l64[static_cast<std::size_t>(r)] = (r * r + 5) % v);  // repeats
    for (const Tensor& ids : {Tensor::from_vector(l32, {n}, Device::cpu()),
                              Tensor::from_vector(l64, {n}, Device::cpu())}) {
      const std::string s = std::string(dtype_name(ids.dtype())) + " n=" + std::to_string(n) +
                            " v=" + std::to_string(v);
      expect_close("embedding " + s, [](const V& a) { return embedding(a[0], a[1]); },
                   {uniform({v, c}), ids}, {true, false});
      if (n * v <= (std::int64_t{1} << 28))
        expect_close("cross_entropy " + s, [](const V& a) { return cross_entropy(a[0], a[1]); },
                     {uniform({n, v}, -5.f, 5.f), ids}, {true, false});
    }
  }
}

// The CPU refuses a bad id at once; the GPU reports the same at the next read, without a
// host wait in the op, and its kernels stay inside the table (NaN rows, a NaN loss).
TEST(CudaOps, AnIdOutOfRangeIsRefusedAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor ids =
      Tensor::from_vector(std::vector<std::int64_t>{1, 2, 7, 9, 3}, {5}, Device::cpu());
  const Tensor table = uniform({5, 4});
  std::string want, got;
  try {
    (void)embedding(table, ids);
  } catch (const Error& e) {
    want = e.what();
  }
  DeviceScope on(kGpu);
  const std::int64_t waits = host_waits(DeviceKind::CUDA);
  const Tensor rows = embedding(table.to(kGpu), ids.to(kGpu));
  EXPECT_EQ(host_waits(DeviceKind::CUDA), waits) << "the id check waited for the GPU";
  try {
    raise_deferred_errors();
  } catch (const Error& e) {
    got = e.what();
  }
  ASSERT_FALSE(want.empty());
  // The same report (the first bad id, its index), less the file and line.
  EXPECT_EQ(got.substr(0, got.find(" (")), want.substr(0, want.find(" ("))) << got;
  const std::vector<float> r = rows.to_vector<float>(), t = table.to_vector<float>();
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(r[j], t[4 + j]);
    EXPECT_TRUE(std::isnan(r[8 + j]) && std::isnan(r[12 + j]));
  }
  // A bad label: a NaN loss, the error at the next read; the backward has no one-hot there.
  Tensor logits = make_leaf(uniform({3, 6}).to(kGpu));
  const Tensor labels = Tensor::from_vector(std::vector<std::int32_t>{0, 6, 5}, {3}, kGpu);
  const Tensor loss = cross_entropy(logits, labels);
  const Tensor g = autodiff::grad({sum(loss)}, {Tensor()}, {logits})[0];
  EXPECT_THROW(raise_deferred_errors(), InvalidArgument);
  const std::vector<float> l = loss.to_vector<float>(), gx = g.to_vector<float>();
  EXPECT_TRUE(std::isfinite(l[0]) && std::isnan(l[1]) && std::isfinite(l[2]));
  float row1 = 0.f;
  for (int j = 6; j < 12; ++j)
    row1 += gx[j];
  EXPECT_NEAR(row1, 1.f, 1e-5);  // softmax alone
}

// The norm and clip factor the GPU computes (no host wait) are the CPU's bits.
TEST(CudaOps, NormAndClipFactorOnTheDevice) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> host;
  for (std::int64_t n : {1, 7, 1000, 70001, 3 << 20})
    host.push_back(uniform({n}));
  std::vector<Tensor> dev;
  for (const Tensor& t : host)
    dev.push_back(t.to(kGpu));
  for (double max_norm : {0.0, 1.0, 1e9}) {
    const NormAndClipFactor want = norm_and_clip_factor(host, max_norm);
    const std::int64_t waits = host_waits(DeviceKind::CUDA);
    DeviceScope on(kGpu);
    const NormAndClipFactor got = norm_and_clip_factor(dev, max_norm);
    Tensor scaled = dev[3].clone();
    scale_by_(scaled, got.factor);
    EXPECT_EQ(host_waits(DeviceKind::CUDA), waits) << "the norm waited for the GPU";
    EXPECT_EQ(got.norm.item<float>(), want.norm.item<float>()) << max_norm;
    EXPECT_EQ(got.factor.item<float>(), want.factor.item<float>()) << max_norm;
    Tensor cpu_scaled = host[3].clone();
    scale_by_(cpu_scaled, want.factor);
    EXPECT_EQ(scaled.to_vector<float>(), cpu_scaled.to_vector<float>()) << max_norm;
  }
}

TEST(CudaOps, DropoutDrawsTheCpusMask) {
  SKIP_WITHOUT_GPU();
  expect_close("dropout", [](const V& a) { return dropout(a[0], 0.3f, Key::from_seed(5)); },
               {uniform({300, 701})}, {true});
  expect_close("dropout of a block",
               [](const V& a) {
                 return dropout(a[0], 0.25f, Key::from_seed(6), {8, 400, 2000}, {2, 100, 500});
               },
               {uniform({4, 200, 1000})}, {true});
}

TEST(CudaOps, Attention) {
  SKIP_WITHOUT_GPU();
  struct Case {
    std::int64_t b, h, t, s, d;
    bool causal;
  };
  for (const Case& c :
       {Case{2, 3, 70, 70, 16, true}, Case{2, 3, 70, 70, 16, false}, Case{1, 2, 33, 90, 32, true},
        Case{1, 2, 90, 33, 32, true}, Case{2, 4, 256, 256, 64, true},
        Case{1, 2, 128, 128, 128, true}, Case{1, 2, 40, 40, 24, false}}) {
    expect_close("attention T=" + std::to_string(c.t) + " S=" + std::to_string(c.s) +
                     " D=" + std::to_string(c.d) + (c.causal ? " causal" : ""),
                 [causal = c.causal](const V& a) { return attention(a[0], a[1], a[2], causal); },
                 {uniform({c.b, c.h, c.t, c.d}), uniform({c.b, c.h, c.s, c.d}),
                  uniform({c.b, c.h, c.s, c.d})},
                 {true, true, true});
  }
  for (bool causal : {true, false})
    expect_close("attention_packed",
                 [causal](const V& a) { return attention_packed(a[0], 4, causal); },
                 {uniform({2, 70, 3 * 4 * 16})}, {true});
  expect_close("attention_packed GPT-2 head shape",
               [](const V& a) { return attention_packed(a[0], 12, true); },
               {uniform({2, 256, 3 * 768})}, {true});
}

// The blockwise attention of context parallelism (tensor::attention_block, its merge and
// its backward) at global positions: a block of queries over an earlier block, over the
// diagonal one and over a later one (no row sees a key: 0 and -inf), merged.
TEST(CudaOps, AttentionBlocksAndTheirMerge) {
  SKIP_WITHOUT_GPU();
  const std::int64_t b = 2, h = 3, t = 40, d = 16;
  const auto positions = [](std::int32_t from, std::int64_t n) {
    std::vector<std::int32_t> p(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = from + 2 * static_cast<std::int32_t>(i);
    return Tensor::from_vector(p, {n});
  };
  const Tensor qpos = positions(100, t);
  for (const auto& [name, kpos] :
       {std::pair{"earlier", positions(0, t)}, std::pair{"diagonal", positions(101, t)},
        std::pair{"later", positions(1000, t)}}) {
    const V in{uniform({b, h, t, d}), uniform({b, h, t, d}), uniform({b, h, t, d}), qpos, kpos};
    const std::vector<bool> none(in.size(), false);
    expect_close(std::string("attention_block output, ") + name,
                 [](const V& a) { return attention_block(a[0], a[1], a[2], a[3], a[4]).out; }, in,
                 none);
    expect_close(std::string("attention_block lse, ") + name,
                 [](const V& a) {
                   // -inf rows compared as a large negative number
                   return maximum(attention_block(a[0], a[1], a[2], a[3], a[4]).lse,
                                  Tensor::full({1}, -1e30, DType::F32, a[0].device()));
                 },
                 in, none);
  }
  // Two blocks merged, and each block's share of the gradients from the merged result.
  const V in{uniform({b, h, t, d}), uniform({b, h, t, d}), uniform({b, h, t, d}),
             uniform({b, h, t, d}), uniform({b, h, t, d}), uniform({b, h, t, d}),
             qpos,                  positions(0, t),       positions(101, t)};
  const auto merged = [](const V& a) {
    AttentionPart whole = attention_block(a[0], a[1], a[2], a[6], a[7]);
    attention_merge(whole, attention_block(a[0], a[3], a[4], a[6], a[8]));
    return whole;
  };
  const std::vector<bool> none(in.size(), false);
  expect_close("attention_merge", [&](const V& a) { return merged(a).out; }, in, none);
  expect_close("attention_block_backward",
               [&](const V& a) {
                 const AttentionGrads g =
                     attention_block_backward(a[0], a[3], a[4], a[6], a[8], merged(a), a[5]);
                 return concat({g.dq, g.dk, g.dv}, 0);
               },
               in, none);
}

// Sets an environment variable for a scope (the previous value back after).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// bf16 products (the bf16 policy's attention) against the CPU's f32 ones at kBf16 (operands
// rounded to bf16, f32 accumulation), every head size the own kernels are built for
// (padded to 32, 64, 128), masks, T != S, both layouts.
void expect_bf16_attention_close() {
  struct Case {
    std::int64_t b, h, t, s, d;
    bool causal;
  };
  for (const Case& c : {Case{2, 3, 70, 70, 16, true}, Case{2, 3, 70, 70, 24, false},
                        Case{1, 2, 33, 90, 32, true}, Case{1, 2, 90, 33, 32, true},
                        Case{2, 4, 256, 256, 64, true}, Case{1, 3, 130, 200, 64, false},
                        Case{1, 2, 128, 128, 128, true}, Case{1, 2, 65, 65, 100, true}}) {
    expect_close(
        "bf16 attention T=" + std::to_string(c.t) + " S=" + std::to_string(c.s) +
            " D=" + std::to_string(c.d) + (c.causal ? " causal" : ""),
        [causal = c.causal](const V& a) {
          return attention(a[0], a[1], a[2], causal, 0.f, DType::BF16);
        },
        {uniform({c.b, c.h, c.t, c.d}), uniform({c.b, c.h, c.s, c.d}),
         uniform({c.b, c.h, c.s, c.d})},
        {true, true, true}, kBf16);
  }
  for (bool causal : {true, false})
    expect_close(
        "bf16 attention_packed",
        [causal](const V& a) { return attention_packed(a[0], 4, causal, 0.f, DType::BF16); },
        {uniform({2, 70, 3 * 4 * 16})}, {true}, kBf16);
  expect_close(
      "bf16 attention_packed GPT-2 head shape",
      [](const V& a) { return attention_packed(a[0], 12, true, 0.f, DType::BF16); },
      {uniform({2, 256, 3 * 768})}, {true}, kBf16);
}

// The own tensor-core kernels (attention_mma.cu), cuDNN turned off.
TEST(CudaOps, AttentionWithBf16Products) {
  SKIP_WITHOUT_GPU();
  ScopedEnv own("DISTJAX_CUDA_ATTENTION", "own");
  expect_bf16_attention_close();

  // The tensor-core path is the one taken: on the GPU, bf16 products differ from f32 ones
  // by bf16's rounding (about 2^-9 relative per operand), neither 0 nor beyond kBf16.
  const V in{uniform({2, 256, 3 * 768})};
  const Tensor ct = uniform({2, 256, 768});
  auto on_gpu = [&](DType compute) {
    return run_on(
        kGpu, [compute](const V& a) { return attention_packed(a[0], 12, true, 0.f, compute); }, in,
        {true}, ct);
  };
  const V f32 = on_gpu(DType::F32), bf16 = on_gpu(DType::BF16);
  for (std::size_t i = 0; i < f32.size(); ++i) {
    const std::vector<float> x = f32[i].to_vector<float>(), y = bf16[i].to_vector<float>();
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      diff += (double(x[j]) - y[j]) * (double(x[j]) - y[j]);
      norm += double(x[j]) * x[j];
    }
    const double rel = std::sqrt(diff / norm);
    EXPECT_GT(rel, 1e-4) << (i ? "gradient" : "output") << ": bf16 products equal f32 ones";
    EXPECT_LT(rel, kBf16) << (i ? "gradient" : "output");
  }
}

// Document ids (packed documents): ids (B, T) with boundaries at every few positions and
// ids that are not sorted, every path of the own kernels: the tiled f32 ones (D padded to
// 16 ... 128), the rows kernels (D over 128), and the tensor-core ones (bf16 products).
Tensor document_ids(std::int64_t b, std::int64_t t, bool striped) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(b * t));
  for (std::int64_t i = 0; i < b * t; ++i)
    ids[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(striped ? i % 3 : (i % t) / (7 + 13 * (i / t)));
  return Tensor::from_vector(ids, {b, t});
}

TEST(CudaOps, AttentionWithDocumentIds) {
  SKIP_WITHOUT_GPU();
  ScopedEnv own("DISTJAX_CUDA_ATTENTION", "own");
  for (std::int64_t d : {16, 64, 128, 136})
    for (bool causal : {true, false})
      for (bool striped : {false, true}) {
        const std::int64_t b = 2, h = 2, t = 90;
        const std::string what = "attention with ids D=" + std::to_string(d) +
                                 (causal ? " causal" : "") + (striped ? " striped" : "");
        expect_close(what,
                     [causal](const V& a) {
                       return attention(a[0], a[1], a[2], causal, 0.f, DType::F32, DType::F32,
                                        a[3]);
                     },
                     {uniform({b, h, t, d}), uniform({b, h, t, d}), uniform({b, h, t, d}),
                      document_ids(b, t, striped)},
                     {true, true, true, false});
        if (d <= 128)
          expect_close(
              "bf16 " + what,
              [causal](const V& a) {
                return attention(a[0], a[1], a[2], causal, 0.f, DType::BF16, DType::F32, a[3]);
              },
              {uniform({b, h, t, d}), uniform({b, h, t, d}), uniform({b, h, t, d}),
               document_ids(b, t, striped)},
              {true, true, true, false}, kBf16);
      }
  expect_close(
      "attention_packed with ids",
      [](const V& a) { return attention_packed(a[0], 4, true, 0.f, DType::F32, DType::F32, a[1]); },
      {uniform({2, 70, 3 * 4 * 16}), document_ids(2, 70, false)}, {true, false});
}

// cuDNN's fused attention (attention_cudnn.cpp), where it loads: the same cases (those it
// refuses run the own kernels), and the GPT-2 head shape through cuDNN itself, forward and
// backward. Skips where cuDNN is not there, unless DISTJAX_REQUIRE_CUDNN=1 (the GPU
// machine's runs), which makes that a failure.
TEST(CudaOps, AttentionWithBf16ProductsThroughCudnn) {
  SKIP_WITHOUT_GPU();
  const std::string library = cuda_attention_library();
  std::printf("bf16 attention: %s\n", library.c_str());
  if (library.rfind("cuDNN ", 0) != 0) {
    const char* require = std::getenv("DISTJAX_REQUIRE_CUDNN");
    if (require != nullptr && std::string(require) == "1")
      FAIL() << "DISTJAX_REQUIRE_CUDNN=1, but " << library;
    GTEST_SKIP() << library;
  }
  ScopedEnv auto_mode("DISTJAX_CUDA_ATTENTION", "auto");
  expect_bf16_attention_close();
  ScopedEnv cudnn("DISTJAX_CUDA_ATTENTION", "cudnn");  // cuDNN, or an error
  const CudnnAttentionCalls before = cuda_attention_cudnn_calls();
  expect_close(
      "bf16 attention_packed GPT-2 head shape through cuDNN",
      [](const V& a) { return attention_packed(a[0], 12, true, 0.f, DType::BF16); },
      {uniform({2, 256, 3 * 768})}, {true}, kBf16);
  const CudnnAttentionCalls after = cuda_attention_cudnn_calls();
  EXPECT_EQ(after.forward - before.forward, 1);
  EXPECT_EQ(after.backward - before.backward, 1);
  // A problem it refuses is an error under "cudnn", naming why.
  try {
    run_on(
        kGpu, [](const V& a) { return attention_packed(a[0], 2, true, 0.f, DType::BF16); },
        {uniform({1, 16, 3 * 2 * 12})}, {false}, Tensor());
    ADD_FAILURE() << "head size 12 ran under DISTJAX_CUDA_ATTENTION=cudnn";
  } catch (const NotImplemented& e) {
    EXPECT_NE(std::string(e.what()).find("head size 12"), std::string::npos) << e.what();
  }
}

// The in-place family: accumulation, copies of runs and boxes, GEMMs into blocks.
TEST(CudaOps, InPlaceOps) {
  SKIP_WITHOUT_GPU();
  const Tensor a = uniform({300, 41}), b = uniform({300, 41});
  auto check = [](const std::string& what, const std::function<Tensor(Device)>& f,
                  double rtol = kF32) {
    SCOPED_TRACE(what);
    Tensor want, got;
    {
      DeviceScope on(Device::cpu());
      want = f(Device::cpu());
    }
    {
      DeviceScope on(kGpu);
      got = f(kGpu).to(Device::cpu());
    }
    EXPECT_TRUE(close(got, want, rtol));
  };
  check("add_into", [&](Device d) {
    Tensor dst = a.to(d).clone();
    add_into(dst, b.to(d));
    return dst;
  });
  check("copy_into", [&](Device d) {
    Tensor dst = Tensor::zeros({300, 41}, DType::F32, d);
    copy_into(dst, b.to(d));
    return dst;
  });
  check("copy_rows_into", [&](Device d) {
    Tensor dst = Tensor::zeros({300, 41}, DType::F32, d);
    copy_rows_into(dst, {5, 41}, b.to(d), {3, 82}, 100, 30);
    return dst;
  });
  for (float beta : {0.f, 1.f})
    check("gemm_into beta=" + std::to_string(beta), [&](Device d) {
      Tensor c = a.to(d).clone();
      // c's 20 x 10 block at (2, 5) = 0.5 a's 20 x 30 block at (1, 0) times the transpose of
      // b's 10 x 30 block at (0, 7), plus beta times itself.
      gemm_into(c, {2 * 41 + 5, 41}, a.to(d), {41, 41}, false, b.to(d), {7, 41}, true, 20, 10, 30,
                0.5f, beta);
      return c;
    });
  for (DType dtype : {DType::F32, DType::BF16, DType::F16})
    check(std::string("scale_into ") + dtype_name(dtype), [&](Device d) {
      Tensor x = astype(a.to(d), dtype).clone();  // a's own memory stays a's (f32: the same)
      scale_into(x, Tensor::full({}, -0.7, DType::F32, d));
      return astype(x, DType::F32);
    });
  // Into a block of rows in bf16, and accumulated into f32 with a transposed operand.
  check(
      "matmul_into bf16 rows",
      [&](Device d) {
        Tensor c = Tensor::zeros({310, 30}, DType::BF16, d);
        matmul_into(c.view_rows(5, 305), astype(a.to(d), DType::BF16),
                    astype(b.to(d).view_rows(0, 30), DType::BF16), false, true);
        return astype(c, DType::F32);
      },
      kBf16);
  const Tensor c0 = uniform({41, 41});
  check(
      "matmul_into accumulate",
      [&](Device d) {
        Tensor c = c0.to(d).clone();
        for (int i = 0; i < 2; ++i)
          matmul_into(c, astype(a.to(d), DType::BF16), astype(b.to(d), DType::BF16), true, false,
                      /*accumulate=*/true);
        return c;
      },
      kBf16);
  const Tensor global = uniform({6, 50, 7}), box = uniform({3, 20, 4});
  check("copy_from_box", [&](Device d) {
    Tensor local = Tensor::zeros({3, 20, 4}, DType::F32, d);
    copy_from_box(local, global.to(d), {2, 10, 3});
    return local;
  });
  check("copy_to_box", [&](Device d) {
    Tensor out = Tensor::zeros({6, 50, 7}, DType::F32, d);
    copy_to_box(out, {1, 30, 2}, box.to(d));
    return out;
  });
}

TEST(CudaOps, OptimizerUpdates) {
  SKIP_WITHOUT_GPU();
  const Tensor p0 = uniform({1000, 37}), g = uniform({1000, 37});
  const Tensor m0 = uniform({1000, 37}, -0.1f, 0.1f), v0 = uniform({1000, 37}, 0.f, 0.01f);
  auto check = [&](const std::string& what, const std::function<V(Device)>& f) {
    SCOPED_TRACE(what);
    V want, got;
    {
      DeviceScope on(Device::cpu());
      want = f(Device::cpu());
    }
    {
      DeviceScope on(kGpu);
      for (const Tensor& t : f(kGpu))
        got.push_back(t.to(Device::cpu()));
    }
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(close(got[i], want[i], kF32)) << i;
  };
  for (const SGDStep& s : {SGDStep{0.1f, 0.f, 0.01f, false}, SGDStep{0.1f, 0.9f, 0.01f, false},
                           SGDStep{0.1f, 0.9f, 0.f, true}})
    check("sgd momentum " + std::to_string(s.momentum), [&](Device d) {
      Tensor p = p0.to(d).clone(), buf = s.momentum > 0 ? m0.to(d).clone() : Tensor();
      for (int i = 0; i < 3; ++i)
        sgd_update_(p, g.to(d), buf, s);
      return s.momentum > 0 ? V{p, buf} : V{p};
    });
  for (const AdamStep& s : {AdamStep{1e-3, 0.9, 0.999, 1e-8, 1, 1.0, 0.0},
                            AdamStep{3e-3, 0.9, 0.95, 1e-8, 7, 1.0 - 3e-3 * 0.1, 0.0},
                            AdamStep{1e-3, 0.8, 0.99, 1e-6, 3, 1.0, 0.01}})
    check("adam t=" + std::to_string(s.t), [&](Device d) {
      Tensor p = p0.to(d).clone(), m = m0.to(d).clone(), v = v0.to(d).clone();
      adam_update_(p, g.to(d), m, v, s);
      return V{p, m, v};
    });
  check("scale_", [&](Device d) {
    Tensor p = p0.to(d).clone();
    scale_(p, 0.37);
    return V{p};
  });
  for (const Shape& shape : {Shape{1000, 37}, Shape{3}, Shape{(1 << 22) + 5}}) {
    const Tensor x = uniform(shape);
    const double want = sum_of_squares(x);
    const double want64 = sum_of_squares_f64(x);
    const Tensor xg = x.to(kGpu);
    DeviceScope on(kGpu);
    EXPECT_NEAR(sum_of_squares(xg), want, 1e-9 * want) << to_string(shape);
    EXPECT_EQ(sum_of_squares_f64(xg), want64) << to_string(shape);  // one order, same bits
  }
  // Many leaves with one host sync: each the same bits as alone on the GPU.
  std::vector<Tensor> leaves;
  for (const Shape& shape : {Shape{1000, 37}, Shape{0}, Shape{3}, Shape{(1 << 20) + 5}})
    leaves.push_back(uniform(shape).to(kGpu));
  DeviceScope on(kGpu);
  const std::vector<double> many = sums_of_squares(leaves), many64 = sums_of_squares_f64(leaves);
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(many[i], sum_of_squares(leaves[i])) << "leaf " << i;
    EXPECT_EQ(many64[i], sum_of_squares_f64(leaves[i])) << "leaf " << i;
  }
}

// The multi-leaf updates (one launch per table of 36 leaves or 320 chunks of 65536 elements)
// over 45 small leaves (some empty), an unaligned leaf (the scalar path), a leaf of several
// chunks and one cut across two tables: the bits of the per-leaf CUDA kernels, whose
// per-element functions they share, and the CPU's within kF32 as for those.
TEST(CudaOps, MultiLeafOptimizerUpdates) {
  SKIP_WITHOUT_GPU();
  std::vector<std::int64_t> sizes;
  for (int i = 0; i < 45; ++i)
    sizes.push_back(i * 37 % 101);
  sizes.push_back(1001);             // unaligned below
  sizes.push_back(2 * 65536 + 7);    // three chunks
  sizes.push_back(330 * 65536 + 5);  // more chunks than one table holds
  const std::size_t unaligned = 45;
  // Host values of each leaf's p, g, m, v: one element more than the leaf, which views
  // elements [1, n] of them on the unaligned leaf and [0, n) elsewhere.
  std::vector<V> host(4);
  for (std::int64_t n : sizes) {
    host[0].push_back(uniform({n + 1}));
    host[1].push_back(uniform({n + 1}));
    host[2].push_back(uniform({n + 1}, -0.1f, 0.1f));
    host[3].push_back(uniform({n + 1}, 0.f, 0.01f));
  }
  // Fresh leaves on d: [which][leaf].
  auto leaves_on = [&](Device d) {
    std::vector<V> out(4);
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const std::int64_t n = sizes[i], first = i == unaligned ? 1 : 0;
        out[k].push_back(
            host[k][i].to(d).clone().view({n + 1, 1}).view_rows(first, first + n).view({n}));
      }
    return out;
  };
  auto records = [&](std::vector<V>& l, bool with_m, bool with_v) {
    std::vector<tensor::UpdateLeaf> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      out.push_back({&l[0][i], &l[1][i], with_m ? &l[2][i] : nullptr, with_v ? &l[3][i] : nullptr,
                     i % 3 == 0 ? 1.0 - 3e-3 * 0.1 : 1.0});
    return out;
  };
  // Per leaf on the CPU, per leaf on the GPU, many at once on the GPU: two steps.
  auto compare = [&](const std::string& what, const std::function<void(std::vector<V>&)>& per_leaf,
                     const std::function<void(std::vector<V>&)>& many) {
    SCOPED_TRACE(what);
    std::vector<V> cpu = leaves_on(Device::cpu()), one = leaves_on(kGpu), all = leaves_on(kGpu);
    {
      DeviceScope on(Device::cpu());
      per_leaf(cpu);
    }
    DeviceScope on(kGpu);
    per_leaf(one);
    many(all);
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const Tensor got = all[k][i].to(Device::cpu());
        EXPECT_TRUE(distjax::testing::same_bits(got, one[k][i].to(Device::cpu())))
            << "tensor " << k << " of leaf " << i;
        EXPECT_TRUE(close(got, cpu[k][i], kF32)) << "tensor " << k << " of leaf " << i;
      }
  };
  for (const SGDStep& s : {SGDStep{0.1f, 0.f, 0.01f, false}, SGDStep{0.1f, 0.9f, 0.01f, false},
                           SGDStep{0.1f, 0.9f, 0.f, true}}) {
    const bool momentum = s.momentum > 0;
    compare(
        "sgd momentum " + std::to_string(s.momentum),
        [&](std::vector<V>& l) {
          Tensor none;
          for (int t = 0; t < 2; ++t)
            for (std::size_t i = 0; i < sizes.size(); ++i)
              sgd_update_(l[0][i], l[1][i], momentum ? l[2][i] : none, s);
        },
        [&](std::vector<V>& l) {
          for (int t = 0; t < 2; ++t)
            tensor::sgd_update_many_(records(l, momentum, false), s);
        });
  }
  for (const AdamStep& s :
       {AdamStep{1e-3, 0.9, 0.999, 1e-8, 1, 1.0, 0.0}, AdamStep{3e-3, 0.9, 0.95, 1e-8, 7, 1.0, 0.0},
        AdamStep{1e-3, 0.8, 0.99, 1e-6, 3, 1.0, 0.01}})
    compare(
        "adam t=" + std::to_string(s.t),
        [&](std::vector<V>& l) {
          for (int t = 0; t < 2; ++t)
            for (std::size_t i = 0; i < sizes.size(); ++i) {
              AdamStep leaf = s;
              leaf.t += t;
              leaf.decay = i % 3 == 0 ? 1.0 - 3e-3 * 0.1 : 1.0;
              adam_update_(l[0][i], l[1][i], l[2][i], l[3][i], leaf);
            }
        },
        [&](std::vector<V>& l) {
          for (int t = 0; t < 2; ++t) {
            AdamStep step = s;
            step.t += t;
            tensor::adam_update_many_(records(l, true, true), step);
          }
        });
}

TEST(CudaOps, ParallelOps) {
  SKIP_WITHOUT_GPU();
  std::vector<std::int64_t> ids(500);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int64_t>((i * 37) % 120) - (i == 77 || i == 300 ? 200 : 0);
  const Tensor ids64 = Tensor::from_vector(ids, {20, 25}, Device::cpu());
  const Tensor ids32 = astype(ids64, DType::I32);
  for (const Tensor& t : {ids64, ids32}) {
    const ShardIds want = shard_ids(t, 30, 40, 120);
    ShardIds got;
    {
      DeviceScope on(kGpu);
      got = shard_ids(t.to(kGpu), 30, 40, 120);
    }
    EXPECT_TRUE(distjax::testing::same_bits(got.local.to(Device::cpu()), want.local));
    EXPECT_TRUE(distjax::testing::same_bits(got.keep.to(Device::cpu()), want.keep));
    EXPECT_EQ(got.out_of_range.count, want.out_of_range.count);
    EXPECT_EQ(got.out_of_range.first, want.out_of_range.first);
    EXPECT_EQ(want.out_of_range.count, 2);

    const ShardOneHot want_hot = shard_one_hot(t, 30, 40, 120);
    ShardOneHot got_hot;
    {
      DeviceScope on(kGpu);
      got_hot = shard_one_hot(t.to(kGpu), 30, 40, 120);
    }
    EXPECT_TRUE(distjax::testing::same_bits(got_hot.one_hot.to(Device::cpu()), want_hot.one_hot));
    EXPECT_EQ(got_hot.out_of_range.count, want_hot.out_of_range.count);
    EXPECT_EQ(got_hot.out_of_range.first, want_hot.out_of_range.first);
  }
  const Tensor a = astype(astype(uniform({40, 30}, 0.f, 4.f), DType::I32), DType::F32);
  const Tensor b = astype(astype(uniform({40, 30}, 0.f, 4.f), DType::I32), DType::F32);
  expect_close("select_equal", [](const V& x) { return select_equal(x[0], x[1], 2.5f); }, {a, b},
               {false, false});
  expect_close(
      "select_equal, one b",
      [](const V& x) { return select_equal(x[0], slice(reshape(x[1], {1200}), 0, 0, 1), 1.f); },
      {a, b}, {false, false});
}

}  // namespace
