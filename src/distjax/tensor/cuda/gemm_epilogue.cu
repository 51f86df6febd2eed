// The GEMM family's epilogue backward on CUDA (table/gemm.hpp, epilogue_backward; the CPU's
// in cpu/gemm.cpp): for a linear's cotangent g (rows x n), d = g * gelu'(aux) or g, written
// rounded for the backward's GEMMs, with the bias gradient (d's column sums) in the same
// pass. Block (kColTile, kColLanes) owns kColTile columns of one chunk of rows; its lanes
// take the chunk's rows in turn, then lane sums are added in lane order into
// part[chunk][column], and column_sums (column_sums.cuh) adds the chunks (deterministic, no
// float atomics). Bound: the bytes of g, aux and out (GPT-2's fc1 at batch 32: 800 MB).
// Each thread keeps several 16-byte (8-byte for halves) loads in flight: one 4-byte load per
// thread at a time left an H100 at about a third of its bandwidth (this op took 5.8 ms of a
// 78.6 ms GPT-2 124M step at batch 32).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/column_sums.cuh"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"
#include "distjax/tensor/detail/unary_math.hpp"

namespace distjax::tensor::cuda {
namespace {

using detail::unary_math::GeluTanh;

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

// Elements i..i+V-1 of an f32, bf16 or f16 buffer as f32 (V = 4: one 16-byte access for
// f32, 8 bytes for halves; i a multiple of 4 and the buffer aligned so).
template <int V>
__device__ inline void load_n(const void* p, DType t, std::int64_t i, float* v) {
  if constexpr (V == 4) {
    if (t == DType::F32) {
      const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
      return;
    }
    const ushort4 u = *reinterpret_cast<const ushort4*>(static_cast<const unsigned short*>(p) + i);
    const unsigned short h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      v[e] = t == DType::BF16 ? f32_from_bf16(Bf16{h[e]}) : f32_from_f16(F16{h[e]});
  } else {
    v[0] = load(p, t, i);
  }
}

template <int V>
__device__ inline void store_n(void* p, DType t, std::int64_t i, const float* v) {
  if constexpr (V == 4) {
    if (t == DType::F32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
    unsigned short h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      h[e] = t == DType::BF16 ? bf16_from_f32(v[e]).bits : f16_from_f32(v[e]).bits;
    *reinterpret_cast<ushort4*>(static_cast<unsigned short*>(p) + i) =
        make_ushort4(h[0], h[1], h[2], h[3]);
  } else {
    store(p, t, i, v[0]);
  }
}

// Each thread owns V adjacent columns (V = 4: vector accesses, where n and the buffers
// allow), its lane every kColLanes-th row of the chunk, several rows in flight; each
// column's sum runs over the same rows in the same order whatever V.
template <int V>
__global__ void epilogue_backward_kernel(const void* __restrict__ g, DType g_dtype,
                                         const void* __restrict__ aux, DType aux_dtype,
                                         void* __restrict__ out, DType out_dtype,
                                         float* __restrict__ part, std::int64_t rows,
                                         std::int64_t n, std::int64_t chunk_rows) {
  __shared__ float lanes[kColLanes][kColTile * V + 1];
  const std::int64_t col = (std::int64_t(blockIdx.x) * kColTile + threadIdx.x) * V;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float sum[V] = {};
  if (col < n) {  // V = 4 only where n % 4 == 0: then the pack lies inside the row
#pragma unroll 4
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const std::int64_t i = r * n + col;
      float d[V];
      load_n<V>(g, g_dtype, i, d);
      if (aux) {
        float x[V];
        load_n<V>(aux, aux_dtype, i, x);
#pragma unroll
        for (int e = 0; e < V; ++e)
          d[e] = d[e] * GeluTanh{}.df(x[e], 0.f);
      }
      if (out) store_n<V>(out, out_dtype, i, d);
#pragma unroll
      for (int e = 0; e < V; ++e)
        sum[e] += d[e];
    }
  }
  if (!part) return;
#pragma unroll
  for (int e = 0; e < V; ++e)
    lanes[threadIdx.y][threadIdx.x * V + e] = sum[e];
  __syncthreads();
  if (threadIdx.y != 0 || col >= n) return;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    float s = sum[e];
    for (int l = 1; l < kColLanes; ++l)
      s += lanes[l][threadIdx.x * V + e];
    part[chunk * n + col + e] = s;
  }
}

}  // namespace

void epilogue_backward(const void* g, DType g_dtype, const void* aux, DType aux_dtype, void* out,
                       DType out_dtype, float* bias_grad, std::int64_t rows, std::int64_t n) {
  constexpr const char* kOp = "linear_backward";
  const cudaStream_t st = thread_stream();
  if (n == 0) return;
  if (rows == 0) {
    if (bias_grad)
      DISTJAX_CUDA_CHECK(cudaMemsetAsync(bias_grad, 0, std::size_t(n) * sizeof(float), st), kOp);
    return;
  }
  // Packs of 4 columns where every row's start stays aligned for them.
  const auto aligned = [](const void* p, DType t) {
    return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (t == DType::F32 ? 16 : 8) == 0;
  };
  const bool v4 =
      n % 4 == 0 && aligned(g, g_dtype) && aligned(aux, aux_dtype) && aligned(out, out_dtype);
  const std::int64_t width = kColTile * (v4 ? 4 : 1);
  const std::int64_t tiles = (n + width - 1) / width;
  const ColumnChunks cc = column_chunks(rows, n);
  const std::int64_t chunks = cc.chunks, chunk_rows = cc.chunk_rows;  // rows and n alone
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kColLanes);
  auto launch = [&](float* part) {
    if (v4)
      epilogue_backward_kernel<4><<<grid, block, 0, st>>>(g, g_dtype, aux, aux_dtype, out,
                                                          out_dtype, part, rows, n, chunk_rows);
    else
      epilogue_backward_kernel<1><<<grid, block, 0, st>>>(g, g_dtype, aux, aux_dtype, out,
                                                          out_dtype, part, rows, n, chunk_rows);
    DISTJAX_CUDA_LAUNCHED(kOp);
  };
  if (!bias_grad) {
    launch(nullptr);
    return;
  }
  StreamScratch part(std::size_t(chunks * n) * sizeof(float), st, kOp);
  launch(part.as<float>());
  column_sums(part.as<float>(), bias_grad, nullptr, nullptr, n, chunks, st);
  DISTJAX_CUDA_LAUNCHED(kOp);
  part.release();
}

}  // namespace distjax::tensor::cuda
