// What the attention family's two kernel files (attention.cu, attention_mma.cu) share to
// read their operands' tiles. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace distjax::tensor::cuda {

/// Row r's four floats from column c of a (rows, d) operand whose rows lie ld floats apart
/// from `src`: zero for rows past `rows` and columns from d on. vec: src, ld and d allow
/// 16-byte reads.
__device__ __forceinline__ float4 load_quad(const float* __restrict__ src, std::int64_t ld,
                                            int r, int c, std::int64_t rows, std::int64_t d,
                                            bool vec) {
  float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
  if (r < rows && c < d) {
    const float* p = src + std::int64_t(r) * ld + c;
    if (vec) {
      val = *reinterpret_cast<const float4*>(p);
    } else {
      val.x = p[0];
      if (c + 1 < d) val.y = p[1];
      if (c + 2 < d) val.z = p[2];
      if (c + 3 < d) val.w = p[3];
    }
  }
  return val;
}

}  // namespace distjax::tensor::cuda
