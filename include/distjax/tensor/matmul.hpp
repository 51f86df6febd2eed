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
