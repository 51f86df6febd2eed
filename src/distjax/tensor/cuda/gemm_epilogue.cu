// The GEMM family's epilogue backward on CUDA (table/gemm.hpp, epilogue_backward; the CPU's
// in cpu/gemm.cpp): for a linear's cotangent g (rows x n), d = g * gelu'(aux) or g, written
// rounded for the backward's GEMMs, with the bias gradient (d's column sums) in the same
// pass. Block (kColTile, kColLanes) owns kColTile columns of one chunk of rows; its lanes
// take the chunk's rows in turn, then lane sums are added in lane order into
// part[chunk][column], and a second kernel adds the chunks in order (deterministic, no
// float atomics). Bound: the bytes of g, aux and out (GPT-2's fc1 at batch 32: 800 MB).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"
#include "distjax/tensor/cuda/unary_ops.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::Stream;

constexpr int kColTile = 32;
constexpr int kColLanes = 8;

// Element i of an f32, bf16 or f16 buffer, as f32 (the dtype is uniform across a launch).
__device__ inline float load(const void* p, DType t, std::int64_t i) {
  if (t == DType::BF16) return f32_from_bf16(static_cast<const Bf16*>(p)[i]);
  if (t == DType::F16) return f32_from_f16(static_cast<const F16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ inline void store(void* p, DType t, std::int64_t i, float v) {
  if (t == DType::BF16)
    static_cast<Bf16*>(p)[i] = bf16_from_f32(v);
  else if (t == DType::F16)
    static_cast<F16*>(p)[i] = f16_from_f32(v);
  else
    static_cast<float*>(p)[i] = v;
}

__global__ void epilogue_backward_kernel(const void* __restrict__ g, DType g_dtype,
                                         const void* __restrict__ aux, DType aux_dtype,
                                         void* __restrict__ out, DType out_dtype,
                                         float* __restrict__ part, std::int64_t rows,
                                         std::int64_t n, std::int64_t chunk_rows) {
  __shared__ float lanes[kColLanes][kColTile + 1];
  const std::int64_t col = std::int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float sum = 0.f;
  if (col < n) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const std::int64_t i = r * n + col;
      float d = load(g, g_dtype, i);
      if (aux) d = d * GeluTanh{}.df(load(aux, aux_dtype, i), 0.f);
      if (out) store(out, out_dtype, i, d);
      sum += d;
    }
  }
  if (!part) return;
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || col >= n) return;
  for (int l = 1; l < kColLanes; ++l)
    sum += lanes[l][threadIdx.x];
  part[chunk * n + col] = sum;
}

// bias_grad[col] = the chunks' partial sums in chunk order.
__global__ void column_sum_final_kernel(const float* __restrict__ part,
                                        float* __restrict__ bias_grad, std::int64_t n,
                                        std::int64_t chunks) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t col = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < n;
       col += stride) {
    float s = 0.f;
    for (std::int64_t k = 0; k < chunks; ++k)
      s += part[k * n + col];
    bias_grad[col] = s;
  }
}

}  // namespace

void epilogue_backward(const void* g, DType g_dtype, const void* aux, DType aux_dtype, void* out,
                       DType out_dtype, float* bias_grad, std::int64_t rows, std::int64_t n,
                       Stream s) {
  constexpr const char* kOp = "linear_backward";
  const cudaStream_t st = stream_of(s);
  if (n == 0) return;
  if (rows == 0) {
    if (bias_grad)
      DISTJAX_CUDA_CHECK(cudaMemsetAsync(bias_grad, 0, std::size_t(n) * sizeof(float), st), kOp);
    return;
  }
  const std::int64_t tiles = (n + kColTile - 1) / kColTile;
  // About 1024 blocks in all (8 per SM of an H100), each chunk at least kColLanes rows;
  // the chunking depends on rows and n only.
  std::int64_t chunks = std::clamp<std::int64_t>((1024 + tiles - 1) / tiles, 1, 65535);
  chunks = std::min<std::int64_t>(chunks, std::max<std::int64_t>(1, rows / kColLanes));
  const std::int64_t chunk_rows = std::max<std::int64_t>(1, (rows + chunks - 1) / chunks);
  chunks = std::max<std::int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  if (!bias_grad) {
    epilogue_backward_kernel<<<grid, dim3(kColTile, kColLanes), 0, st>>>(
        g, g_dtype, aux, aux_dtype, out, out_dtype, nullptr, rows, n, chunk_rows);
    DISTJAX_CUDA_LAUNCHED(kOp);
    return;
  }
  StreamScratch part(std::size_t(chunks * n) * sizeof(float), st, kOp);
  epilogue_backward_kernel<<<grid, dim3(kColTile, kColLanes), 0, st>>>(
      g, g_dtype, aux, aux_dtype, out, out_dtype, part.as<float>(), rows, n, chunk_rows);
  DISTJAX_CUDA_LAUNCHED(kOp);
  column_sum_final_kernel<<<grid_for(n), kThreads, 0, st>>>(part.as<float>(), bias_grad, n, chunks);
  DISTJAX_CUDA_LAUNCHED(kOp);
  part.release();
}

}  // namespace distjax::tensor::cuda
