// CPU kernels: accumulation into a tensor and GEMMs on sub-blocks.
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Bound by memory: 12 bytes moved per element.
void add_f32(float* __restrict dst, const float* __restrict src, std::int64_t n, Stream) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] += src[i];
}

// oneDNN's sgemm (through tensor::detail::gemm_f32_ld, shared with matmul).
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
              float beta, float* c, std::int64_t ldc, Stream) {
  gemm_f32_ld(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

const InplaceKernels inplace_kernels{
    .add_f32 = add_f32,
    .gemm_f32 = gemm_f32,
};

}  // namespace distjax::tensor::detail::cpu
