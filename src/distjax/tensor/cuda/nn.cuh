// What the CUDA kernels of the nn family share (nn.cu, nn_embedding.cu, nn_dropout.cu):
// packed row access, block reductions, the id dtypes, and the launchers that nn.cu's
// kernel table takes from the other two files. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/table/nn.hpp"

namespace distjax::tensor::cuda::nn {

using detail::DropoutMask;

// ------------------------------------------------------------------ packed rows

/// V consecutive floats of a row: V = 4 moves them as one 16-byte access (the row's
/// pointer 16-byte aligned and its length a multiple of 4), V = 1 one at a time.
template <int V>
struct Pack {
  float v[V];
};

/// Pack j of p (floats j V .. j V + V - 1).
template <int V>
__device__ __forceinline__ Pack<V> load_pack(const float* p, std::int64_t j) {
  if constexpr (V == 4) {
    const float4 f = reinterpret_cast<const float4*>(p)[j];
    return {{f.x, f.y, f.z, f.w}};
  } else {
    return {{p[j]}};
  }
}

/// Pack j of a bf16 row, widened (V = 4: one 8-byte access).
template <int V>
__device__ __forceinline__ Pack<V> load_pack(const Bf16* p, std::int64_t j) {
  if constexpr (V == 4) {
    const ushort4 u = reinterpret_cast<const ushort4*>(p)[j];
    return {
        {f32_from_bf16({u.x}), f32_from_bf16({u.y}), f32_from_bf16({u.z}), f32_from_bf16({u.w})}};
  } else {
    return {{f32_from_bf16(p[j])}};
  }
}

/// Element i of an f32 or bf16 buffer, as f32.
__device__ __forceinline__ float load_f32(const float* p, std::int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load_f32(const Bf16* p, std::int64_t i) {
  return f32_from_bf16(p[i]);
}

template <int V>
__device__ __forceinline__ void store_pack(float* p, std::int64_t j, const Pack<V>& x) {
  if constexpr (V == 4)
    reinterpret_cast<float4*>(p)[j] = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  else
    p[j] = x.v[0];
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// Whether rows of c floats at every pointer given (null ones ignored) can move in
/// 16-byte packs.
inline bool packs_of_4(std::int64_t c, std::initializer_list<const void*> ptrs) {
  if (c % 4 != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

/// Threads for a block that owns one row of c floats: about one pack of 4 per thread,
/// a power of two in [32, max_threads].
inline int row_threads(std::int64_t c, int max_threads = 512) {
  int t = 32;
  while (t < max_threads && std::int64_t(t) * 4 < c)
    t *= 2;
  return t;
}

/// Blocks for a grid-stride loop over n rows, one block per row while that fits.
inline unsigned row_blocks(std::int64_t n) {
  return static_cast<unsigned>(n < (std::int64_t(1) << 30) ? n : (std::int64_t(1) << 30));
}

// ------------------------------------------------------------------ reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

/// The sum of v over the block (blockDim.x a multiple of 32), returned to every thread. Each
/// warp reduces the warps' partial sums in the same fixed order, so the result does not
/// depend on timing. `red` is 32 floats of shared memory, free again on return.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? red[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

/// As block_sum, for the maximum.
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? red[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

// ------------------------------------------------------------------ ids

/// Calls f with the ids as the C++ type of id_dtype (i32 or i64), as the CPU kernels do.
template <class F>
void with_ids(const void* ids, DType id_dtype, F&& f) {
  if (id_dtype == DType::I32)
    f(static_cast<const std::int32_t*>(ids));
  else
    f(static_cast<const std::int64_t*>(ids));
}

// ------------------------------------------------------------------ launchers (nn_*.cu)

void find_bad_id(const void* ids, DType id_dtype, std::int64_t n, std::int64_t v,
                 std::int64_t* bad);
void embedding(const float* table, const void* ids, DType id_dtype, float* out, std::int64_t n,
               std::int64_t c, std::int64_t v);
void embedding_backward(const float* g, const void* ids, DType id_dtype, float* gtable,
                        std::int64_t n, std::int64_t c, std::int64_t v);
void dropout(const float* x, float* y, std::int64_t n, const DropoutMask& mask,
             const std::int64_t* run_offsets);

}  // namespace distjax::tensor::cuda::nn
