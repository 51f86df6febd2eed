// The CUDA op harness's products (label "gpu"), with op_harness.hpp's poisoning and
// tolerances: matmul and linear through cuBLASLt, linear's epilogues and their backward,
// the MLP as one op (DGELU_BGRAD), and the language-model head with its loss in chunks.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "distjax/distjax.hpp"
#include "distjax/tensor/cuda.hpp"
#include "gpu/op_harness.hpp"

namespace {

using namespace distjax;
using namespace distjax::tensor;
using namespace distjax::testing::gpu_ops;

TEST(CudaOps, MatrixProducts) {
  SKIP_WITHOUT_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string s = std::string("ta=") + (ta ? "1" : "0") + " tb=" + (tb ? "1" : "0");
      const Shape sa = ta ? Shape{3, 65, 33} : Shape{3, 33, 65};
      const Shape sb = tb ? Shape{3, 17, 65} : Shape{3, 65, 17};
      expect_close("batched matmul " + s,
                   [ta, tb](const V& a) { return matmul(a[0], a[1], ta, tb); },
                   {uniform(sa), uniform(sb)}, {true, true});
      const Shape shared = tb ? Shape{17, 65} : Shape{65, 17};
      expect_close("matmul, one B for every batch " + s,
                   [ta, tb](const V& a) { return matmul(a[0], a[1], ta, tb); },
                   {uniform(sa), uniform(shared)}, {true, true});
      expect_close(
          "bf16 matmul " + s,
          [ta, tb](const V& a) {
            return matmul(astype(a[0], DType::BF16), astype(a[1], DType::BF16), ta, tb);
          },
          {uniform(sa), uniform(sb)}, {true, true}, kBf16);
      // f16 on the tensor cores (the CPU widens to f32): equal products, f32 sums.
      expect_close(
          "f16 matmul " + s,
          [ta, tb](const V& a) {
            return matmul(astype(a[0], DType::F16), astype(a[1], DType::F16), ta, tb);
          },
          {uniform(sa), uniform(sb)}, {true, true}, kF16);
    }
  expect_close("linear with bias", [](const V& a) { return linear(a[0], a[1], a[2]); },
               {uniform({4, 50, 96}), uniform({96, 130}), uniform({130})}, {true, true, true});
  expect_close(
      "bf16 linear with bias",
      [](const V& a) { return linear(astype(a[0], DType::BF16), astype(a[1], DType::BF16), a[2]); },
      {uniform({4, 50, 96}), uniform({96, 130}), uniform({130})}, {true, true, true}, kBf16);
  expect_close(
      "f16 linear with bias",
      [](const V& a) { return linear(astype(a[0], DType::F16), astype(a[1], DType::F16), a[2]); },
      {uniform({4, 50, 96}), uniform({96, 130}), uniform({130})}, {true, true, true}, kF16);
  expect_close("GPT-2 MLP product", [](const V& a) { return linear(a[0], a[1], a[2]); },
               {uniform({2048, 768}), uniform({768, 3072}), uniform({3072})}, {true, true, true});
  set_allow_tf32(true);
  expect_close(
      "TF32 matmul", [](const V& a) { return matmul(a[0], a[1]); },
      {uniform({512, 768}), uniform({768, 1024})}, {true, true}, kTf32);
  set_allow_tf32(false);
}

// linear's epilogues (cuBLASLt's BIAS, GELU_AUX and GELU_AUX_BIAS with an f32, bf16 or f16
// D; an f32 sum and the elementwise kernels where cuBLASLt has none, as for N = 130, whose
// aux leading dimension is no multiple of 8; a residual as cuBLASLt's C) and their backward
// (epilogue_backward), with the cotangent arriving in the output's dtype (through astype)
// and in f32 (through a product). A 16-bit cotangent in the output's dtype without GELU
// takes gemm_bias_grad: the bias gradient in dW's product (cuBLASLt's BGRADA), or the
// product and the column sums.
TEST(CudaOps, LinearEpilogues) {
  SKIP_WITHOUT_GPU();
  const CudaGemmEpilogueCalls before = cuda_gemm_epilogue_calls();
  struct Case {
    DType operands, out;
    double tol;
  };
  for (const Case& c : {Case{DType::F32, DType::F32, kF32}, Case{DType::BF16, DType::F32, kBf16},
                        Case{DType::BF16, DType::BF16, kBf16}, Case{DType::F16, DType::F16, kF16}})
    for (const Shape& w_shape : {Shape{96, 128}, Shape{96, 130}, Shape{768, 3072}})
      for (bool gelu : {false, true})
        for (bool bias : {false, true}) {
          const std::string s = std::string(dtype_name(c.operands)) + " -> " + dtype_name(c.out) +
                                " " + to_string(w_shape) + (gelu ? " gelu" : "") +
                                (bias ? " bias" : "");
          const LinearEpilogue e{.gelu = gelu, .out = c.out};
          const DType op = c.operands;
          const Fn through_astype = [e, op, bias](const V& a) {
            return astype(linear(astype(a[0], op), astype(a[1], op), bias ? a[2] : Tensor(), e),
                          DType::F32);
          };
          const Shape x_shape = w_shape[0] == 768 ? Shape{4, 512, 768} : Shape{4, 50, 96};
          const Tensor x = uniform(x_shape), w = uniform(w_shape), b = uniform({w_shape[1]});
          expect_close("linear " + s, through_astype, {x, w, b}, {true, true, bias}, c.tol);
          if (c.out == DType::F32) continue;
          const Fn through_product = [e, op, bias](const V& a) {
            const Tensor y = linear(astype(a[0], op), astype(a[1], op), bias ? a[2] : Tensor(), e);
            return matmul(y, astype(a[3], op));
          };
          expect_close("linear, f32 cotangent " + s, through_product,
                       {x, w, b, uniform({w_shape[1], 24})}, {true, true, bias, true}, c.tol);
        }
  // A residual: cuBLASLt's C (beta = 1), the bias added after it.
  for (const DType op : {DType::F32, DType::BF16})
    expect_close(
        std::string("linear with a residual, ") + dtype_name(op),
        [op](const V& a) {
          return linear(astype(a[0], op), astype(a[1], op), a[2], {.residual = a[3]});
        },
        {uniform({4, 50, 96}), uniform({96, 128}), uniform({128}), uniform({4, 50, 128})},
        {true, true, true, true}, op == DType::F32 ? kF32 : kBf16);
  // N = 130 always falls back; the rest runs in cuBLASLt's epilogues where it has them.
  const CudaGemmEpilogueCalls after = cuda_gemm_epilogue_calls();
  std::printf("gemm epilogues: %lld fused in cuBLASLt, %lld as an f32 sum and kernels\n",
              static_cast<long long>(after.fused - before.fused),
              static_cast<long long>(after.unfused - before.unfused));
  EXPECT_GT(after.unfused, before.unfused);
}

// The MLP as one op: its backward's fc2 dX product with GELU's derivative in cuBLASLt's
// DGELU epilogue for bf16 (fc1's bias gradient in it, or summed from its output), the f32
// product and the epilogue_backward kernel for f32 and for a hidden width of 130.
TEST(CudaOps, GeluMlp) {
  SKIP_WITHOUT_GPU();
  const CudaGemmEpilogueCalls before = cuda_gemm_epilogue_calls();
  for (const DType op : {DType::F32, DType::BF16})
    for (const auto& [c, h] : {std::pair<std::int64_t, std::int64_t>{768, 3072}, {96, 130}})
      for (bool bias : {false, true}) {
        const std::string s = std::string(dtype_name(op)) + " " + std::to_string(c) + " -> " +
                              std::to_string(h) + (bias ? " biases" : "");
        expect_close(
            "gelu_mlp " + s,
            [op, bias](const V& a) {
              return gelu_mlp(astype(a[0], op), astype(a[1], op), bias ? a[2] : Tensor(),
                              astype(a[3], op), bias ? a[4] : Tensor(), a[5]);
            },
            {uniform({4, 128, c}), uniform({c, h}), uniform({h}), uniform({h, c}), uniform({c}),
             uniform({4, 128, c})},
            {true, true, bias, true, bias, true}, op == DType::F32 ? kF32 : kBf16);
      }
  const CudaGemmEpilogueCalls after = cuda_gemm_epilogue_calls();
  std::printf("gelu_mlp's gemm epilogues: %lld fused in cuBLASLt, %lld as an f32 sum and kernels\n",
              static_cast<long long>(after.fused - before.fused),
              static_cast<long long>(after.unfused - before.unfused));
}

// The language-model head and its loss in chunks (the GPT's loss): dw's chunk products
// accumulated in the GEMMs, dx and dw scaled in place by the cotangent; f32 and bf16
// operands, chunks that do and do not divide the rows, w in both layouts, and rows of
// logits far longer than GPT-2's.
TEST(CudaOps, LinearCrossEntropyMean) {
  SKIP_WITHOUT_GPU();
  const std::int64_t rows = 300, k = 64;
  // V = 998: rows of logits that take no packs of 4.
  for (const std::int64_t v : {1000, 998})
    for (DType dtype : {DType::F32, DType::BF16})
      for (bool trans_w : {true, false})
        for (std::int64_t chunk_rows : {64, 300}) {
          std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
          for (std::int64_t r = 0; r < rows; ++r)
            ids[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 37 + 11) % v);
          const Tensor labels = Tensor::from_vector(ids, {rows}, Device::cpu());
          const std::string what = std::string(dtype_name(dtype)) + " V " + std::to_string(v) +
                                   (trans_w ? " w (V, K)" : " w (K, V)") + ", chunks of " +
                                   std::to_string(chunk_rows);
          expect_close(
              "linear_cross_entropy_mean " + what,
              [=](const V& a) {
                return linear_cross_entropy_mean(astype(a[0], dtype), astype(a[1], dtype), a[2],
                                                 trans_w,
                                                 chunk_rows * v * (dtype == DType::BF16 ? 2 : 4));
              },
              {uniform({rows, k}), uniform(trans_w ? Shape{v, k} : Shape{k, v}), labels},
              {true, true, false}, dtype == DType::F32 ? kTf32 : kBf16);
        }
  // Long rows (60k f32 logits, 120k bf16).
  for (const auto& [v, dtype] :
       {std::pair<std::int64_t, DType>{60000, DType::F32}, {120000, DType::BF16}}) {
    std::vector<std::int32_t> ids(16);
    for (std::size_t r = 0; r < ids.size(); ++r)
      ids[r] = static_cast<std::int32_t>((r * 7919 + 13) % static_cast<std::size_t>(v));
    const Tensor labels = Tensor::from_vector(ids, {16}, Device::cpu());
    expect_close(
        std::string("linear_cross_entropy_mean, long rows, ") + dtype_name(dtype),
        [dtype](const V& a) {
          return linear_cross_entropy_mean(astype(a[0], dtype), astype(a[1], dtype), a[2], true);
        },
        {uniform({16, 16}), uniform({v, 16}), labels}, {true, true, false},
        dtype == DType::F32 ? kTf32 : kBf16);
  }
}


// Mixture-of-Experts: the top-k (with ties), the dispatch plan (dropless, by position, by
// priority), dispatch and combine with the gates (values and gradients), and the grouped
// products over ragged groups with an empty one (f32 and bf16, both layouts of w).
TEST(CudaOps, MoeRoutingDispatchCombineAndGroupedProducts) {
  SKIP_WITHOUT_GPU();
  const std::int64_t n = 300, e = 16, k = 4, d = 40;
  // Scores on a coarse grid: ties, which go to the lower column on both devices.
  const Tensor coarse = mul_scalar(astype(astype(mul_scalar(uniform({n, e}), 4.0), DType::I32),
                                          DType::F32), 0.25);
  for (std::int64_t kk : {1, 2, 8})
    expect_close("top_k_indices k " + std::to_string(kk),
                 [kk](const V& a) { return top_k_indices(a[0], kk); }, {coarse}, {false});
  const Tensor experts = top_k_indices(uniform({n, e}), k);
  const Tensor priority = uniform({n, k}, 0.f, 1.f);
  for (std::int64_t capacity : {std::int64_t{-1}, std::int64_t{60}}) {
    for (bool by_priority : {false, true}) {
      const std::string what = "capacity " + std::to_string(capacity) +
                               (by_priority ? " by priority" : " by position");
      const auto plan_of = [capacity, by_priority](const V& a) {
        return dispatch_plan(a[1], e, capacity, by_priority ? a[2] : Tensor());
      };
      const V in{uniform({n, d}), experts, priority, uniform({n, e})};
      expect_close("dispatch_plan, " + what, [&](const V& a) { return plan_of(a).position; }, in,
                   {false, false, false, false});
      // gates from the scores (take_along_last), through dispatch, a nonlinearity, combine.
      expect_close("dispatch and combine, " + what,
                   [&](const V& a) {
                     const DispatchPlan plan = plan_of(a);
                     const Tensor gates = take_along_last(softmax(a[3]), a[1]);
                     return moe_combine(tanh(moe_dispatch(a[0], plan)), plan, gates);
                   },
                   in, {true, false, false, true});
    }
  }
  const std::vector<std::int64_t> offsets{0, 37, 37, 130, 131, 256};
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool trans_w : {false, true}) {
      const V in{uniform({256, 48}), trans_w ? uniform({5, 24, 48}) : uniform({5, 48, 24})};
      expect_close(std::string("grouped_matmul ") + dtype_name(dtype) + (trans_w ? " trans_w" : ""),
                   [&](const V& a) {
                     return grouped_matmul(astype(a[0], dtype), astype(a[1], dtype), offsets,
                                           trans_w);
                   },
                   in, {true, true}, dtype == DType::F32 ? kTf32 : kBf16);
    }
}

}  // namespace
