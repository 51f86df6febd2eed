// CPU kernels: accumulation into a tensor (GEMMs into sub-blocks use the gemm family).
#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Bound by memory: 12 bytes moved per element.
void add_f32(float* __restrict dst, const float* __restrict src, std::int64_t n, Stream) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] += src[i];
}

}  // namespace

const InplaceKernels inplace_kernels{
    .add_f32 = add_f32,
};

}  // namespace distjax::tensor::detail::cpu
