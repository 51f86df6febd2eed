// Kernel family: writes into existing tensors: accumulation (gradient sums across
// micro-batches) and scaling in place (a gradient made for a cotangent of 1). Plain
// arguments only: pointers and sizes. Copies into views are the copy family's
// copy_2d; GEMMs into sub-blocks (the asynchronous tensor-parallel rings) the gemm
// family's gemm_f32_strided.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

struct InplaceKernels {
  /// dst[i] += src[i] for i < n (f32; dst and src do not overlap).
  void (*add_f32)(float* dst, const float* src, std::int64_t n);
  /// x[i] = x[i] * scale[0] for i < n, x of `dtype` (f32, bf16 or f16: widened, multiplied
  /// in f32, rounded back); `scale` one f32 in the device's memory.
  void (*scale)(void* x, DType dtype, const float* scale, std::int64_t n);
};

}  // namespace distjax::tensor::detail
