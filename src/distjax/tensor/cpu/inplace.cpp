// CPU kernels: accumulation into a tensor (GEMMs into sub-blocks use the gemm family).
#include "distjax/core/error.hpp"
#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Bound by memory: 12 bytes moved per element.
void add_f32(float* __restrict dst, const float* __restrict src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] += src[i];
}

template <class T>
void scale_as(T* x, float s, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrainMemory)
  for (std::int64_t i = 0; i < n; ++i)
    x[i] = T(static_cast<float>(x[i]) * s);
}

void scale(void* x, DType dtype, const float* s, std::int64_t n) {
  switch (dtype) {
    case DType::F32:
      return scale_as(static_cast<float*>(x), *s, n);
    case DType::BF16:
      return scale_as(static_cast<bf16*>(x), *s, n);
    case DType::F16:
      return scale_as(static_cast<f16*>(x), *s, n);
    default:
      DISTJAX_THROW(NotImplemented, "[scale] scales f32, bf16 or f16, not ", dtype_name(dtype));
  }
}

}  // namespace

const InplaceKernels inplace_kernels{
    .add_f32 = add_f32,
    .scale = scale,
};

}  // namespace distjax::tensor::detail::cpu
