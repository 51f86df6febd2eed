// Kernel family: matrix products. The batched GEMM of matmul and linear, described by one
// GemmKey (on the CPU: oneDNN matmul primitives cached per key), and a strided f32 GEMM
// with leading dimensions, alpha and beta for the products the key does not describe.
// Plain arguments only: the descriptor, pointers and sizes.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

/// A batched GEMM problem: C[b] = op(A[b]) op(B[b or 0]) (+ bias), all row-major and
/// contiguous per batch (A[b] is M x K, or K x M with ta; B[b] K x N, or N x K with tb).
/// `src` is the dtype of A and B: f32, or bf16 (oneDNN's bf16 matmul, AVX-512 BF16,
/// accumulating in f32), or f16 on CUDA only (the CPU's matmul widens f16 to f32 first).
/// The bias is f32. The epilogue works on the f32 sum P = A B + bias: C = P, or with `gelu`
/// C = gelu_tanh(P) and aux = P (the pre-activation the backward reads); C and aux are
/// rounded to `dst` (f32, bf16 or f16) as they are written.
struct GemmKey {
  std::int64_t batch, m, n, k;
  bool ta, tb, b_shared, bias;
  DType src = DType::F32;
  DType dst = DType::F32;
  bool gelu = false;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKernels {
  /// Runs `key` (the CPU: the calling thread's cached primitive, parallel over the OpenMP
  /// threads). bias (N) only when key.bias; aux (batch M x N of key.dst) only with
  /// key.gelu. `residual` (batch M x N f32, or null) is added to P, with an f32 C and no
  /// GELU only (a residual connection: C = residual + A B + bias); it may be C itself (the
  /// product accumulates into C). k == 0 sums to zero (P
  /// is the bias). `a` and `b` point to elements of key.src, `c` to elements of key.dst.
  /// CUDA fuses the epilogue into cuBLASLt's (BIAS, GELU_AUX_BIAS; the residual as C).
  void (*gemm)(const GemmKey& key, const void* a, const void* b, const float* bias,
               const float* residual, void* c, void* aux);
  /// The epilogue's backward, for the cotangent g (rows x n, f32 or g_dtype) of C:
  ///   d = g * gelu_tanh'(aux) with an aux (the forward's, aux_dtype), else g   (in f32)
  ///   out = d rounded to out_dtype (what the backward's GEMMs read; skipped when null)
  ///   bias_grad[j] = the sum of d's column j (f32; skipped when null), in an order that
  ///   depends on rows and n only.
  /// One pass over g instead of the GELU backward, a cast and a column sum.
  void (*epilogue_backward)(const void* g, DType g_dtype, const void* aux, DType aux_dtype,
                            void* out, DType out_dtype, float* bias_grad, std::int64_t rows,
                            std::int64_t n);
  /// The product of a layer that reads a GELU's output, with that GELU's derivative in
  /// its epilogue: for `key` (batch 1, no bias, no gelu flag), d = (A B) * gelu_tanh'(aux)
  /// in f32, with aux (M x N of key.dst: the GELU's pre-activation kept by the forward), C
  /// = d rounded to key.dst, and bias_grad[j] (f32; skipped when null) = the sum of d's
  /// column j: the cotangent of that GELU's input and its layer's bias gradient (the MLP's
  /// fc2 dX product; cuBLASLt's DGELU_BGRAD). The same numbers as the f32 product followed
  /// by epilogue_backward, without the product in memory.
  void (*gemm_dgelu)(const GemmKey& key, const void* a, const void* b, const void* aux, void* c,
                     float* bias_grad);
  /// A layer's weight gradient with its bias gradient: for `key` (batch 1, ta, not tb, no
  /// bias, no gelu: C = A^T B, the K rows of A and B being the layer's rows), C as `gemm`
  /// writes it, and bias_grad[j] (f32) = the sum of column j of B (B's values as stored,
  /// widened), deterministic for a given problem: the bias gradient of a layer whose
  /// cotangent B needs no pass of its own (no GELU, already in the operands' dtype). The
  /// same numbers as `gemm` and epilogue_backward's column sums (CUDA: cuBLASLt's BGRADA
  /// epilogue where it has one, reducing over K inside the product, in its own order).
  void (*gemm_bias_grad)(const GemmKey& key, const void* a, const void* b, void* c,
                         float* bias_grad);
  /// For i < batch, in order: C_i = alpha * op(A_i) op(B_i) + beta * C_i on row-major f32
  /// matrices, A_i = a + i * stride_a (op(A_i) m x k, stored k x m when trans_a, lda
  /// elements between its rows), B_i = b + i * stride_b (op(B_i) k x n, stored n x k when
  /// trans_b), C_i = c + i * stride_c (m x n). A stride of 0 reuses one matrix: with
  /// stride_c = 0 and beta = 1 the products accumulate into one C.
  void (*gemm_f32_strided)(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                           std::int64_t k, float alpha, const float* a, std::int64_t lda,
                           std::int64_t stride_a, const float* b, std::int64_t ldb,
                           std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                           std::int64_t stride_c, std::int64_t batch);
};

}  // namespace distjax::tensor::detail
