// CUDA kernels: sum and max over the middle of (outer, r, inner), max's backward and argmax
// (table/reduce.hpp; cpu/reduce.cpp defines the results). Every reduction combines in a
// fixed order that depends only on the sizes and the input's alignment, never on timing:
// equal inputs give equal bits from run to run. Measured on an H200 (HBM ~4.8 TB/s; sums,
// GB/s of input read): rows (16384, 768) 3.3 TB/s, (8192, 50257) 4.5, (1, 64M) 3.5;
// columns (64, 1024, 768) 3.3, the bias gradient (1, 16384, 768) 1.8 (50 MB: two
// launches and the scratch weigh), (8192, 2, 768) 2.1, (1, 8M, 4) 1.5.
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>

#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::BroadcastPlan;
using detail::ReduceOp;

constexpr unsigned kFullMask = 0xffffffffu;
// Rows up to this length get one warp each; longer ones a block (or several).
constexpr std::int64_t kWarpRowMax = 1024;
// Blocks that keep every SM of an H100 busy (132 SMs x 8 blocks of 256 threads). A fixed
// number, not the device's: the chunking, and so the bits, are the same on every card.
constexpr std::int64_t kTargetBlocks = 132 * 8;
// The least a chunk of a split reduction reads (32 KiB), so that each block streams.
constexpr std::int64_t kMinChunkFloats = 8192;
// Column tiles of the column kernels: 32 columns (one per lane, or 4 per lane with float4
// loads) by up to 8 rows (warps).
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;
// Runs up to this length (inner >= 32) get one thread per output and no tiles.
constexpr std::int64_t kShortRun = 16;

struct SumOp {
  __device__ static float init() { return 0.f; }
  __device__ static float combine(float a, float b) { return a + b; }
};

// The CPU's max: b replaces a only when greater (a NaN met later is skipped).
struct MaxOp {
  __device__ static float init() { return -CUDART_INF_F; }
  __device__ static float combine(float a, float b) { return b > a ? b : a; }
};

__host__ __device__ constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Calls f(value, index) for the elements p[index], index < len, that thread t of nt owns:
// a scalar head up to p's first 16-byte boundary, float4 loads, a scalar tail. Each thread
// sees its elements in increasing index order.
template <class F>
__device__ void for_range(const float* __restrict__ p, std::int64_t len, int t, int nt, F&& f) {
  const std::int64_t head =
      min(len,
          static_cast<std::int64_t>(((16 - (reinterpret_cast<std::uintptr_t>(p) & 15)) & 15) >> 2));
  if (t < head) f(p[t], std::int64_t(t));
  const float4* v = reinterpret_cast<const float4*>(p + head);
  const std::int64_t nv = (len - head) >> 2;
  for (std::int64_t k = t; k < nv; k += nt) {
    const float4 q = v[k];
    const std::int64_t at = head + 4 * k;
    f(q.x, at);
    f(q.y, at + 1);
    f(q.z, at + 2);
    f(q.w, at + 3);
  }
  for (std::int64_t e = head + 4 * nv + t; e < len; e += nt)
    f(p[e], e);
}

// Lane 0 gets the warp's combination (a fixed tree).
template <class Op>
__device__ float warp_reduce(float v) {
  for (int off = 16; off > 0; off >>= 1)
    v = Op::combine(v, __shfl_down_sync(kFullMask, v, off));
  return v;
}

// Thread 0 gets the block's combination (blockDim.x a multiple of 32); `shared` holds 32
// floats and may be reused after the call.
template <class Op>
__device__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce<Op>(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : Op::init();
    v = warp_reduce<Op>(v);
  }
  __syncthreads();
  return v;
}

// out[row] = op over the row x[row * r, (row + 1) * r), one warp per row (rows up to ~1K).
// Bound: 4 bytes read per element.
template <class Op>
__global__ void reduce_rows_warp(const float* __restrict__ x, float* __restrict__ out,
                                 std::int64_t rows, std::int64_t r) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x >> 5);
  for (std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       row < rows; row += warps) {
    float acc = Op::init();
    for_range(x + row * r, r, lane, 32, [&](float v, std::int64_t) { acc = Op::combine(acc, v); });
    acc = warp_reduce<Op>(acc);
    if (lane == 0) out[row] = acc;
  }
}

// out[row * chunks + c] = op over chunk c (elements [c * chunk, (c + 1) * chunk) of the row)
// of each row of r elements, one block per (row, chunk). With chunks == 1, out is the
// result; else partials that reduce_rows_warp combines. Bound: 4 bytes read per element.
template <class Op>
__global__ void reduce_rows_block(const float* __restrict__ x, float* __restrict__ out,
                                  std::int64_t rows, std::int64_t r, std::int64_t chunks,
                                  std::int64_t chunk) {
  __shared__ float shared[32];
  for (std::int64_t b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const std::int64_t row = b / chunks, j0 = (b % chunks) * chunk;
    float acc = Op::init();
    for_range(x + row * r + j0, min(chunk, r - j0), threadIdx.x, blockDim.x,
              [&](float v, std::int64_t) { acc = Op::combine(acc, v); });
    acc = block_reduce<Op>(acc, shared);
    if (threadIdx.x == 0) out[b] = acc;
  }
}

// V consecutive floats of x (V = 1, or 4 from a 16-byte aligned address).
template <int V>
struct Floats {
  float v[V];
};

template <int V>
__device__ Floats<V> load_floats(const float* p) {
  Floats<V> f;
  if constexpr (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    f.v[0] = q.x;
    f.v[1] = q.y;
    f.v[2] = q.z;
    f.v[3] = q.w;
  } else {
    f.v[0] = *p;
  }
  return f;
}

template <class Op, int V>
__device__ void combine_floats(Floats<V>& acc, const Floats<V>& b) {
#pragma unroll
  for (int q = 0; q < V; ++q)
    acc.v[q] = Op::combine(acc.v[q], b.v[q]);
}

template <class Op, int V>
__device__ Floats<V> init_floats() {
  Floats<V> f;
#pragma unroll
  for (int q = 0; q < V; ++q)
    f.v[q] = Op::init();
  return f;
}

// out[c, o, i] = op over rows [c * chunk, (c + 1) * chunk) of x[o, :, i], for inner >= 32:
// a block of (32, ry) threads per (o, tile of 32 * V columns, chunk c), each warp reading
// 32 * V adjacent columns of one row (coalesced; V = 4 when inner % 4 == 0 and x is 16-byte
// aligned), the ry row partials combined in a fixed tree. Bound: 4 bytes read per element.
template <class Op, int V>
__global__ void reduce_cols_tile(const float* __restrict__ x, float* __restrict__ out,
                                 std::int64_t outer, std::int64_t r, std::int64_t inner,
                                 std::int64_t chunks, std::int64_t chunk) {
  __shared__ Floats<V> part[kTileRows][kTileCols];
  const std::int64_t tiles = ceil_div(inner, kTileCols * V);
  const int tx = threadIdx.x, ty = threadIdx.y, ry = blockDim.y;
  for (std::int64_t b = blockIdx.x; b < outer * tiles * chunks; b += gridDim.x) {
    const std::int64_t c = b % chunks, rest = b / chunks;
    const std::int64_t o = rest / tiles, i = ((rest % tiles) * kTileCols + tx) * V;
    const std::int64_t j1 = min(r, (c + 1) * chunk);
    Floats<V> acc = init_floats<Op, V>();
    if (i < inner) {
      const float* col = x + o * r * inner + i;
#pragma unroll 4
      for (std::int64_t j = c * chunk + ty; j < j1; j += ry)
        combine_floats<Op>(acc, load_floats<V>(col + j * inner));
    }
    part[ty][tx] = acc;
    __syncthreads();
    for (int h = ry; h > 1;) {
      const int half = (h + 1) / 2;
      if (ty < h - half) combine_floats<Op>(part[ty][tx], part[ty + half][tx]);
      h = half;
      __syncthreads();
    }
    if (ty == 0 && i < inner)
#pragma unroll
      for (int q = 0; q < V; ++q)
        out[c * outer * inner + o * inner + i + q] = part[0][tx].v[q];
    __syncthreads();
  }
}

// out[o, i] = op over j < r of x[o, j, i] for short runs (r <= kShortRun) and inner >= 32:
// one thread per V outputs (V as in reduce_cols_tile), columns over blockIdx.x and the
// threads, o over blockIdx.y, j in order. Bound: 4 bytes read per element.
template <class Op, int V>
__global__ void reduce_cols_short(const float* __restrict__ x, float* __restrict__ out,
                                  std::int64_t outer, std::int64_t r, std::int64_t inner) {
  const std::int64_t step = std::int64_t(gridDim.x) * blockDim.x * V;
  for (std::int64_t o = blockIdx.y; o < outer; o += gridDim.y)
    for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < inner;
         i += step) {
      const float* col = x + o * r * inner + i;
      Floats<V> acc = init_floats<Op, V>();
#pragma unroll 4
      for (std::int64_t j = 0; j < r; ++j)
        combine_floats<Op>(acc, load_floats<V>(col + j * inner));
#pragma unroll
      for (int q = 0; q < V; ++q)
        out[o * inner + i + q] = acc.v[q];
    }
}

// As reduce_cols_tile, for 1 < inner < 32: the block reads the chunk's rows of x[o] as one
// contiguous run, with the `active` = inner * (blockDim.x / inner) first threads, so that
// thread t always meets column t % inner; the per-thread partials of each column are then
// combined in a fixed tree. Bound: 4 bytes read per element.
template <class Op>
__global__ void reduce_cols_narrow(const float* __restrict__ x, float* __restrict__ out,
                                   std::int64_t outer, std::int64_t r, std::int64_t inner,
                                   std::int64_t chunks, std::int64_t chunk) {
  __shared__ float part[kThreads];
  const int t = threadIdx.x;
  const int per = static_cast<int>(blockDim.x / inner);
  const int active = static_cast<int>(inner) * per;
  for (std::int64_t b = blockIdx.x; b < outer * chunks; b += gridDim.x) {
    const std::int64_t c = b % chunks, o = b / chunks;
    const std::int64_t e1 = min(r, (c + 1) * chunk) * inner;
    const float* slab = x + o * r * inner;
    float acc = Op::init();
    if (t < active)
#pragma unroll 4
      for (std::int64_t e = c * chunk * inner + t; e < e1; e += active)
        acc = Op::combine(acc, slab[e]);
    part[t] = acc;
    __syncthreads();
    for (int h = per; h > 1;) {
      const int half = (h + 1) / 2;
      if (t < (h - half) * inner) part[t] = Op::combine(part[t], part[t + half * inner]);
      h = half;
      __syncthreads();
    }
    if (t < inner) out[c * outer * inner + o * inner + t] = part[t];
    __syncthreads();
  }
}

// out[k] = op over j < r of x[j * cols + k], one thread per column k, j in order: the
// second pass of the split column reductions (x their (chunks, cols) partials), and r == 0.
// Bound: 4 bytes read per element.
template <class Op>
__global__ void reduce_cols_simple(const float* __restrict__ x, float* __restrict__ out,
                                   std::int64_t r, std::int64_t cols) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < cols;
       k += stride) {
    float acc = Op::init();
    for (std::int64_t j = 0; j < r; ++j)
      acc = Op::combine(acc, x[j * cols + k]);
    out[k] = acc;
  }
}

// The first maximising index of a run: NaNs are never candidates (the CPU's `>` skips
// them), ties keep the smaller index; j == kNone while a thread has seen no candidate.
constexpr std::int64_t kNone = INT64_MAX;

struct ArgBest {
  float v;
  std::int64_t j;
};

__device__ void arg_take(ArgBest& a, float v, std::int64_t j) {
  if (!isnan(v) && (a.j == kNone || v > a.v)) a = {v, j};
}

__device__ ArgBest arg_combine(ArgBest a, ArgBest b) {
  if (b.j == kNone) return a;
  if (a.j == kNone) return b;
  return b.v > a.v || (b.v == a.v && b.j < a.j) ? b : a;
}

__device__ ArgBest arg_warp_reduce(ArgBest a) {
  for (int off = 16; off > 0; off >>= 1)
    a = arg_combine(a,
                    {__shfl_down_sync(kFullMask, a.v, off), __shfl_down_sync(kFullMask, a.j, off)});
  return a;
}

// The CPU's answer from a row's best candidate: 0 when the row starts with a NaN (nothing
// is greater than it) or is empty, else the first index of the largest non-NaN value.
__device__ std::int64_t arg_result(const float* row, std::int64_t r, ArgBest a) {
  return r == 0 || isnan(row[0]) || a.j == kNone ? 0 : a.j;
}

// out[row] = argmax of the row x[row * r, (row + 1) * r), one warp per row (rows up to
// ~1K). Bound: 4 bytes read per element.
__global__ void argmax_rows_warp(const float* __restrict__ x, std::int64_t* __restrict__ out,
                                 std::int64_t rows, std::int64_t r) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x >> 5);
  for (std::int64_t row = std::int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       row < rows; row += warps) {
    const float* xr = x + row * r;
    ArgBest a{0.f, kNone};
    for_range(xr, r, lane, 32, [&](float v, std::int64_t j) { arg_take(a, v, j); });
    a = arg_warp_reduce(a);
    if (lane == 0) out[row] = arg_result(xr, r, a);
  }
}

// As argmax_rows_warp with one block per row (longer rows). Bound: 4 bytes read per element.
__global__ void argmax_rows_block(const float* __restrict__ x, std::int64_t* __restrict__ out,
                                  std::int64_t rows, std::int64_t r) {
  __shared__ ArgBest shared[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * r;
    ArgBest a{0.f, kNone};
    for_range(xr, r, threadIdx.x, blockDim.x, [&](float v, std::int64_t j) { arg_take(a, v, j); });
    a = arg_warp_reduce(a);
    if (lane == 0) shared[warp] = a;
    __syncthreads();
    if (warp == 0) {
      a = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : ArgBest{0.f, kNone};
      a = arg_warp_reduce(a);
      if (lane == 0) out[row] = arg_result(xr, r, a);
    }
    __syncthreads();
  }
}

// out[o, i] = the first j maximising x[o, j, i], for inner > 1: one thread per (o, i)
// running the CPU's loop (adjacent threads read adjacent columns). Bound: 4 bytes read per
// element.
__global__ void argmax_cols(const float* __restrict__ x, std::int64_t* __restrict__ out,
                            std::int64_t outer, std::int64_t r, std::int64_t inner) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < outer * inner;
       k += stride) {
    const float* col = x + (k / inner) * r * inner + k % inner;
    std::int64_t best = 0;
    float bv = r > 0 ? col[0] : 0.f;
    for (std::int64_t j = 1; j < r; ++j) {
      const float v = col[j * inner];
      if (v > bv) {
        best = j;
        bv = v;
      }
    }
    out[k] = best;
  }
}

// Max's backward over a run, first pass: first[row] = min over the chunks of the first j
// in chunk (row, c) with x[row, j] == m[row], for inner == 1. One block per (row, chunk)
// scans its chunk in tiles of blockDim.x elements and stops at the first tile with a hit.
// Bound: 4 bytes read per element up to the hit.
__global__ void max_first_rows(const float* __restrict__ x, const float* __restrict__ m,
                               unsigned long long* __restrict__ first, std::int64_t rows,
                               std::int64_t r, std::int64_t chunks, std::int64_t chunk) {
  __shared__ unsigned long long hit;
  for (std::int64_t b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const std::int64_t row = b / chunks, j0 = (b % chunks) * chunk;
    const std::int64_t j1 = min(r, j0 + chunk);
    const float* xr = x + row * r;
    const float mv = m[row];
    if (threadIdx.x == 0) hit = ~0ull;
    __syncthreads();
    for (std::int64_t t0 = j0; t0 < j1; t0 += blockDim.x) {
      const std::int64_t j = t0 + threadIdx.x;
      const bool found = j < j1 && xr[j] == mv;
      if (found) atomicMin(&hit, static_cast<unsigned long long>(j));
      if (__syncthreads_or(found)) break;
    }
    if (threadIdx.x == 0 && hit != ~0ull) atomicMin(&first[row], hit);
    __syncthreads();
  }
}

// Max's backward over a run, first pass for inner > 1: first[o, i] = min over the chunks of
// the first j in the chunk with x[o, j, i] == m[o, i]; blocks of (32, ry) threads per
// (o, tile of 32 columns, chunk) as in reduce_cols_tile, each thread stopping at its first
// hit. Bound: 4 bytes read per element up to the hits.
__global__ void max_first_cols(const float* __restrict__ x, const float* __restrict__ m,
                               unsigned long long* __restrict__ first, std::int64_t outer,
                               std::int64_t r, std::int64_t inner, std::int64_t chunks,
                               std::int64_t chunk) {
  __shared__ unsigned long long hit[kTileRows][kTileCols];
  const std::int64_t tiles = ceil_div(inner, kTileCols);
  const int tx = threadIdx.x, ty = threadIdx.y, ry = blockDim.y;
  for (std::int64_t b = blockIdx.x; b < outer * tiles * chunks; b += gridDim.x) {
    const std::int64_t c = b % chunks, rest = b / chunks;
    const std::int64_t o = rest / tiles, i = (rest % tiles) * kTileCols + tx;
    const std::int64_t j1 = min(r, (c + 1) * chunk);
    unsigned long long h = ~0ull;
    if (i < inner) {
      const float* col = x + o * r * inner + i;
      const float mv = m[o * inner + i];
      for (std::int64_t j = c * chunk + ty; j < j1; j += ry)
        if (col[j * inner] == mv) {
          h = static_cast<unsigned long long>(j);
          break;
        }
    }
    hit[ty][tx] = h;
    __syncthreads();
    if (ty == 0 && i < inner) {
      for (int y = 1; y < ry; ++y)
        h = min(h, hit[y][tx]);
      if (h != ~0ull) atomicMin(&first[o * inner + i], h);
    }
    __syncthreads();
  }
}

// Max's backward over a run, second pass: out[o, first[k], i] = g[k] for each group
// k = (o, i) with a hit. Bound: 8 bytes read per group.
__global__ void max_grad_run_write(const unsigned long long* __restrict__ first,
                                   const float* __restrict__ g, float* __restrict__ out,
                                   std::int64_t groups, std::int64_t r, std::int64_t inner) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < groups;
       k += stride) {
    const unsigned long long j = first[k];
    if (j != ~0ull)
      out[((k / inner) * r + static_cast<std::int64_t>(j)) * inner + k % inner] = g[k];
  }
}

// broadcast_index (table/broadcast.hpp) on the device.
__device__ std::int64_t group_of(const BroadcastPlan& q, std::int64_t i) {
  std::int64_t idx = 0;
  for (int d = q.rank - 1; d >= 0; --d) {
    idx += (i % q.dims[d]) * q.strides[d];
    i /= q.dims[d];
  }
  return idx;
}

// Max's backward, any axes, first pass: first[group of i] = min i with x[i] == m[i].
// Bound: 8 bytes read per element (the group's index is computed at hits only).
__global__ void max_first_general(const float* __restrict__ x, const float* __restrict__ m,
                                  unsigned long long* __restrict__ first, std::int64_t n,
                                  BroadcastPlan groups) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (x[i] == m[i]) atomicMin(&first[group_of(groups, i)], static_cast<unsigned long long>(i));
}

// Max's backward, any axes, second pass: out[first[k]] = g[first[k]] for each group with a
// hit. Bound: 8 bytes read per group.
__global__ void max_grad_general_write(const unsigned long long* __restrict__ first,
                                       const float* __restrict__ g, float* __restrict__ out,
                                       std::int64_t ngroups) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < ngroups;
       k += stride) {
    const unsigned long long i = first[k];
    if (i != ~0ull) out[i] = g[i];
  }
}

// How a split pass cuts r: into chunks of `chunk` (the last shorter) when the unsplit
// pass has fewer than kTargetBlocks blocks (`blocks`), each of at least `min_rows` rows.
struct Split {
  std::int64_t chunks, chunk;
};

Split split_rows(std::int64_t r, std::int64_t blocks, std::int64_t min_rows, std::int64_t align) {
  std::int64_t chunks = 1;
  if (blocks < kTargetBlocks)
    chunks =
        std::max<std::int64_t>(1, std::min(ceil_div(kTargetBlocks, blocks), ceil_div(r, min_rows)));
  const std::int64_t chunk =
      std::max<std::int64_t>(1, ceil_div(ceil_div(r, chunks), align) * align);
  return {ceil_div(std::max<std::int64_t>(r, 1), chunk), chunk};
}

unsigned blocks_for(std::int64_t jobs) {
  return grid_for(jobs, 1);
}

template <class Op>
void reduce_middle(const float* x, float* out, std::int64_t outer, std::int64_t r,
                   std::int64_t inner, cudaStream_t stream) {
  const std::int64_t len = outer * inner;
  if (len == 0) return;
  if (r == 0) {  // nothing to combine: the identity
    reduce_cols_simple<Op><<<grid_for(len), kThreads, 0, stream>>>(x, out, 0, len);
    DISTJAX_CUDA_LAUNCHED("reduce");
    return;
  }
  if (inner == 1) {
    if (r <= kWarpRowMax) {
      reduce_rows_warp<Op><<<grid_for(outer * 32), kThreads, 0, stream>>>(x, out, outer, r);
      DISTJAX_CUDA_LAUNCHED("reduce");
      return;
    }
    const Split s = split_rows(r, outer, kMinChunkFloats, 4);
    if (s.chunks == 1) {
      reduce_rows_block<Op><<<blocks_for(outer), kThreads, 0, stream>>>(x, out, outer, r, 1, r);
      DISTJAX_CUDA_LAUNCHED("reduce");
      return;
    }
    StreamScratch part(outer * s.chunks * sizeof(float), stream, "reduce");
    reduce_rows_block<Op><<<blocks_for(outer * s.chunks), kThreads, 0, stream>>>(
        x, part.as<float>(), outer, r, s.chunks, s.chunk);
    DISTJAX_CUDA_LAUNCHED("reduce");
    reduce_rows_warp<Op>
        <<<grid_for(outer * 32), kThreads, 0, stream>>>(part.as<float>(), out, outer, s.chunks);
    DISTJAX_CUDA_LAUNCHED("reduce");
    part.release();
    return;
  }
  const bool narrow = inner < kTileCols;
  const bool vec = !narrow && inner % 4 == 0 && (reinterpret_cast<std::uintptr_t>(x) & 15) == 0;
  if (!narrow && r <= kShortRun) {
    const std::int64_t threads = ceil_div(inner, vec ? 4 : 1);
    const dim3 grid(
        static_cast<unsigned>(std::min<std::int64_t>(ceil_div(threads, kThreads), 65535)),
        static_cast<unsigned>(std::min<std::int64_t>(outer, 65535)));
    if (vec)
      reduce_cols_short<Op, 4><<<grid, kThreads, 0, stream>>>(x, out, outer, r, inner);
    else
      reduce_cols_short<Op, 1><<<grid, kThreads, 0, stream>>>(x, out, outer, r, inner);
    DISTJAX_CUDA_LAUNCHED("reduce");
    return;
  }
  const std::int64_t cols = narrow ? inner : (vec ? 4 : 1) * kTileCols;  // per block
  const std::int64_t base = narrow ? outer : outer * ceil_div(inner, cols);
  const Split s = split_rows(r, base, ceil_div(kMinChunkFloats, cols), 1);
  auto pass = [&](float* dst) {
    const unsigned blocks = blocks_for(base * s.chunks);
    const dim3 tile(kTileCols, static_cast<unsigned>(std::min<std::int64_t>(r, kTileRows)));
    if (narrow)
      reduce_cols_narrow<Op>
          <<<blocks, kThreads, 0, stream>>>(x, dst, outer, r, inner, s.chunks, s.chunk);
    else if (vec)
      reduce_cols_tile<Op, 4>
          <<<blocks, tile, 0, stream>>>(x, dst, outer, r, inner, s.chunks, s.chunk);
    else
      reduce_cols_tile<Op, 1>
          <<<blocks, tile, 0, stream>>>(x, dst, outer, r, inner, s.chunks, s.chunk);
    DISTJAX_CUDA_LAUNCHED("reduce");
  };
  if (s.chunks == 1) {
    pass(out);
    return;
  }
  StreamScratch part(s.chunks * len * sizeof(float), stream, "reduce");
  pass(part.as<float>());
  reduce_cols_simple<Op>
      <<<grid_for(len), kThreads, 0, stream>>>(part.as<float>(), out, s.chunks, len);
  DISTJAX_CUDA_LAUNCHED("reduce");
  part.release();
}

void reduce(ReduceOp op, const float* x, float* out, std::int64_t outer, std::int64_t r,
            std::int64_t inner) {
  if (op == ReduceOp::Sum)
    reduce_middle<SumOp>(x, out, outer, r, inner, thread_stream());
  else
    reduce_middle<MaxOp>(x, out, outer, r, inner, thread_stream());
}

void max_grad_run(const float* x, const float* m, const float* g, float* out, std::int64_t outer,
                  std::int64_t r, std::int64_t inner) {
  const std::int64_t groups = outer * inner;
  if (groups == 0 || r == 0) return;
  const cudaStream_t stream = thread_stream();
  StreamScratch first(groups * sizeof(unsigned long long), stream, "max");
  DISTJAX_CUDA_CHECK(
      cudaMemsetAsync(first.as<void>(), 0xff, groups * sizeof(unsigned long long), stream), "max");
  if (inner == 1) {
    const Split sp = split_rows(r, outer, kMinChunkFloats, 1);
    max_first_rows<<<blocks_for(outer * sp.chunks), kThreads, 0, stream>>>(
        x, m, first.as<unsigned long long>(), outer, r, sp.chunks, sp.chunk);
  } else {
    const std::int64_t base = outer * ceil_div(inner, kTileCols);
    const Split sp = split_rows(r, base, kMinChunkFloats / kTileCols, 1);
    const dim3 block(kTileCols, static_cast<unsigned>(std::min<std::int64_t>(r, kTileRows)));
    max_first_cols<<<blocks_for(base * sp.chunks), block, 0, stream>>>(
        x, m, first.as<unsigned long long>(), outer, r, inner, sp.chunks, sp.chunk);
  }
  DISTJAX_CUDA_LAUNCHED("max");
  max_grad_run_write<<<grid_for(groups), kThreads, 0, stream>>>(first.as<unsigned long long>(), g,
                                                                out, groups, r, inner);
  DISTJAX_CUDA_LAUNCHED("max");
  first.release();
}

void max_grad_general(const float* x, const float* m, const float* g, float* out, std::int64_t n,
                      const BroadcastPlan& groups, std::int64_t ngroups) {
  if (n == 0 || ngroups == 0) return;
  const cudaStream_t stream = thread_stream();
  StreamScratch first(ngroups * sizeof(unsigned long long), stream, "max");
  DISTJAX_CUDA_CHECK(
      cudaMemsetAsync(first.as<void>(), 0xff, ngroups * sizeof(unsigned long long), stream), "max");
  max_first_general<<<grid_for(n), kThreads, 0, stream>>>(x, m, first.as<unsigned long long>(), n,
                                                          groups);
  DISTJAX_CUDA_LAUNCHED("max");
  max_grad_general_write<<<grid_for(ngroups), kThreads, 0, stream>>>(first.as<unsigned long long>(),
                                                                     g, out, ngroups);
  DISTJAX_CUDA_LAUNCHED("max");
  first.release();
}

void argmax(const float* x, std::int64_t* out, std::int64_t outer, std::int64_t r,
            std::int64_t inner) {
  const std::int64_t len = outer * inner;
  if (len == 0) return;
  const cudaStream_t stream = thread_stream();
  if (inner > 1)
    argmax_cols<<<grid_for(len), kThreads, 0, stream>>>(x, out, outer, r, inner);
  else if (r <= kWarpRowMax)
    argmax_rows_warp<<<grid_for(outer * 32), kThreads, 0, stream>>>(x, out, outer, r);
  else
    argmax_rows_block<<<blocks_for(outer), kThreads, 0, stream>>>(x, out, outer, r);
  DISTJAX_CUDA_LAUNCHED("argmax");
}

}  // namespace

const detail::ReduceKernels reduce_kernels{
    .reduce = reduce,
    .max_grad_run = max_grad_run,
    .max_grad_general = max_grad_general,
    .argmax = argmax,
};

}  // namespace distjax::tensor::cuda
