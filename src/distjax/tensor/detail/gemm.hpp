// Private batched GEMM entry point over cached oneDNN matmul primitives, shared by
// matmul/linear and the fused kernels (attention).
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

/// A batched GEMM problem: C[b] = op(A[b]) op(B[b or 0]) (+ bias), all row-major and
/// contiguous per batch (A[b] is M x K, or K x M with ta; B[b] K x N, or N x K with tb).
/// `src` is the dtype of A and B: f32, or bf16 (oneDNN's bf16 matmul, AVX-512 BF16,
/// accumulating in f32). C and the bias are f32 either way.
struct GemmKey {
  std::int64_t batch, m, n, k;
  bool ta, tb, b_shared, bias;
  DType src = DType::F32;
  bool operator==(const GemmKey&) const = default;
};

/// Runs `key` on the calling thread's cached primitive (oneDNN parallelises it over the
/// OpenMP threads). bias (N) only when key.bias. k == 0 writes zeros. `a` and `b` point
/// to elements of key.src.
void run_gemm(const GemmKey& key, const void* a, const void* b, const float* bias, float* c);

}  // namespace distjax::tensor::detail
