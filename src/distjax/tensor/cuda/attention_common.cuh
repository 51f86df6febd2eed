// What the attention family's two kernel files (attention.cu, attention_mma.cu) share:
// the softmax's log constants, reading their operands' tiles, and their launches' grid and
// shared memory. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda_runtime.hpp"
#include "distjax/tensor/table/attention.hpp"

namespace distjax::tensor::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

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

/// A query-tile block's work: head h, rows [row0, row0 + rows) of its t query rows.
struct QueryTile {
  std::int64_t h, row0, rows;
};
/// Block x of a grid of tile_blocks(a, ceil(t / tile)): query tile (tiles - 1 - x / bh) of
/// head x % bh, so a causal mask's heaviest tiles start first.
__device__ __forceinline__ QueryTile query_tile(const detail::AttentionPlan& a, std::int64_t tile) {
  const std::int64_t tiles = (a.t + tile - 1) / tile;
  const std::int64_t row0 = (tiles - 1 - blockIdx.x / a.bh) * tile;
  return {static_cast<std::int64_t>(blockIdx.x % a.bh), row0, min(tile, a.t - row0)};
}

/// The grid of `tiles` blocks per head of plan a (one grid dimension); errors name `op`.
inline unsigned tile_blocks(const detail::AttentionPlan& a, std::int64_t tiles, const char* op) {
  const std::int64_t blocks = tiles * a.bh;
  DISTJAX_CHECK(blocks <= INT_MAX, InvalidArgument, "[", op, "] ", a.bh, " heads of ", tiles,
                " tiles each exceed one grid");
  return static_cast<unsigned>(blocks);
}

/// Lets `kernel` take `bytes` of dynamic shared memory per block (beyond the default 48 KB).
template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes, const char* op) {
  DISTJAX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)),
                     op, bytes, " bytes of shared memory per block");
}

}  // namespace distjax::tensor::cuda
