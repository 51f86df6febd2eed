// The last step of the chunked column sums (the GEMM epilogue's bias gradient, the norms'
// parameter gradients): their kernels give each (chunk of rows, column) one partial sum;
// this adds a column's partials with a warp per column: lane l takes chunks l, l + 32, ...
// in order, then the warp's fixed butterfly adds the lanes. The result depends on the
// number of chunks only (deterministic, no float atomics), and a column waits for
// chunks / 32 loads instead of chunks one after another. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda {
namespace {

// The chunked column sums' blocks: kColTile threads across (each owning one column, or a
// pack of 4) by kColLanes lanes, which take a chunk's rows in turn.
constexpr int kColTile = 32;
constexpr int kColLanes = 8;

struct ColumnChunks {
  std::int64_t chunks, chunk_rows;
};

// The chunks of `rows` for n columns: about 1024 blocks of one column per thread (8 per SM
// of an H100), each chunk at least kColLanes rows. Kernels with packs of 4 columns per
// thread keep this chunking (a quarter of the blocks, each with 4 times the loads in
// flight), so that each column's sum takes the same rows in the same order either way.
inline ColumnChunks column_chunks(std::int64_t rows, std::int64_t n) {
  const std::int64_t tiles = (n + kColTile - 1) / kColTile;
  std::int64_t chunks = std::clamp<std::int64_t>((1024 + tiles - 1) / tiles, 1, 65535);
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, rows / kColLanes));
  const std::int64_t chunk_rows = std::max<std::int64_t>(1, (rows + chunks - 1) / chunks);
  return {std::max<std::int64_t>(1, (rows + chunk_rows - 1) / chunk_rows), chunk_rows};
}

// out[col] = the sum over k < chunks of part[k * n + col]; out2 from part2 the same way
// where out2 is not null.
__global__ void column_sums_kernel(const float* __restrict__ part, float* __restrict__ out,
                                   const float* __restrict__ part2, float* __restrict__ out2,
                                   std::int64_t n, std::int64_t chunks) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t col = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; col < n;
       col += warps) {
    float s = 0.f, s2 = 0.f;
#pragma unroll 4
    for (std::int64_t k = lane; k < chunks; k += 32) {
      s += part[k * n + col];
      if (out2) s2 += part2[k * n + col];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, off);
      s2 += __shfl_xor_sync(0xffffffffu, s2, off);
    }
    if (lane == 0) {
      out[col] = s;
      if (out2) out2[col] = s2;
    }
  }
}

// Launches column_sums_kernel on st (the caller checks the launch).
inline void column_sums(const float* part, float* out, const float* part2, float* out2,
                        std::int64_t n, std::int64_t chunks, cudaStream_t st) {
  constexpr int kWarpsPerBlock = kThreads / 32;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, 132 * 32));
  column_sums_kernel<<<blocks, kThreads, 0, st>>>(part, out, part2, out2, n, chunks);
}

}  // namespace
}  // namespace distjax::tensor::cuda
