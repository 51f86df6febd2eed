// Private batched GEMM entry point over cached oneDNN matmul primitives, shared by
// matmul/linear and the fused kernels (attention).
#pragma once

#include <cstdint>

namespace distjax::tensor::detail {

/// A batched GEMM problem: C[b] = op(A[b]) op(B[b or 0]) (+ bias), all row-major and
/// contiguous per batch (A[b] is M x K, or K x M with ta; B[b] K x N, or N x K with tb).
struct GemmKey {
  std::int64_t batch, m, n, k;
  bool ta, tb, b_shared, bias;
  bool operator==(const GemmKey&) const = default;
};

/// Runs `key` on the calling thread's cached primitive (oneDNN parallelises it over the
/// OpenMP threads). bias (N) only when key.bias. k == 0 writes zeros.
void run_gemm(const GemmKey& key, const float* a, const float* b, const float* bias, float* c);

}  // namespace distjax::tensor::detail
