// Matrix products through oneDNN (primitives cached by shape): matmul with transposes,
// batched matmul, and the dense layer's fused x @ W + b.
#pragma once

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// Matrix product of the last two dimensions.
///  a: (..., M, K) or (..., K, M) if trans_a;  b: (..., K, N) or (..., N, K) if trans_b.
///  Leading (batch) dimensions must be equal, or b may be 2-D and shared by every batch.
///  Returns (..., M, N), f32.
/// Operands are both f32, both bf16 or both f16. bf16 runs oneDNN's bf16 matmul (AVX-512
/// BF16) accumulating in f32; f16 operands are widened to f32 for the GEMM (no f16 matmul
/// on this CPU), so they carry f16's range and precision only. The result is f32 either
/// way; the backward rounds the cotangent to the operands' dtype, runs its GEMMs in that
/// dtype and returns f32 cotangents (astype's backward passes them on to f32 weights).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

/// Dense layer: x (..., K) @ w (K, N) [+ bias (N)] -> (..., N) f32. The bias add is fused
/// into the GEMM; `bias` (f32) may be undefined. x and w: both f32, bf16 or f16, as matmul.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

/// What linear does with its f32 sum P = x @ w + bias before writing it: the GEMM's epilogue
/// (cuBLASLt's on CUDA, in the product's own kernel; the CPU runs the same steps after
/// oneDNN's product).
struct LinearEpilogue {
  /// GELU in its tanh form (gelu(P, true), GPT-2's) instead of P. The backward reads P,
  /// which the op keeps rounded to `out` (instead of an f32 input kept by gelu).
  bool gelu = false;
  /// The output's dtype: f32, or the operands' own (bf16 or f16), so that the next matmul
  /// reads it as it is (no f32 activation and cast). P is rounded once, as it is written.
  DType out = DType::F32;
  /// A residual connection (..., N) f32 added to P: residual + x @ w + bias, the bits of
  /// add(residual, linear(x, w, bias)) on the CPU (cuBLASLt's C on CUDA, so no separate
  /// pass over the sum). Needs an f32 `out` and no GELU; its cotangent is the output's.
  Tensor residual = Tensor();
};

/// linear(x, w, bias) with `epilogue` applied: (..., N) in epilogue.out. The backward takes
/// the cotangent in f32 or in epilogue.out and makes the bias gradient, GELU's derivative
/// and the cotangent's rounding for its GEMMs in one pass (GemmKernels::epilogue_backward).
///
///   Tensor h = linear(x16, w16, b, {.gelu = true, .out = DType::BF16});  // bf16 gelu(x W + b)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& epilogue);

/// The transformer's MLP as one op: linear(gelu(linear(x, w1, b1)), w2, b2) (+ residual),
/// GELU in its tanh form. x, w1 (K, H) and w2 (H, N) share a dtype (f32, bf16 or f16); b1
/// (H) and b2 (N) f32 or undefined; residual (..., N) f32 or undefined. The forward is the
/// two linears' (fc1 with LinearEpilogue{.gelu = true, .out = x's dtype}, fc2 with
/// {.residual}), bit for bit. The backward makes fc2's dX product with GELU's derivative
/// and fc1's bias gradient in the product's epilogue (GemmKernels::gemm_dgelu: cuBLASLt's
/// DGELU_BGRAD), so the hidden cotangent is not written and read again before the
/// derivative: in f32 the two linears' bits, in bf16 one rounding fewer.
Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                const Tensor& b2, const Tensor& residual = Tensor());

namespace detail {
/// C (M, N) = alpha * op(A) op(B) + beta * C, one GEMM on raw row-major f32 host buffers
/// through oneDNN's sgemm: for the CPU kernels of tensor/cpu/ (ops go through the kernel
/// table's gemm family) and benchmarks.
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, const float* b, float beta, float* c);
/// The same with explicit leading dimensions (row-major: lda >= op-stored row length),
/// for GEMMs on sub-blocks of larger matrices.
void gemm_f32_ld(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc);
}  // namespace detail

}  // namespace distjax::tensor
