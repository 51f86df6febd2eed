// CUDA kernels: the optimizers' fused per-leaf updates (SGD, Adam/AdamW), a sum of squares
// and a scale in place (table/optim.hpp; cpu/optim.cpp defines the results: the same
// per-element formulas, in f32 with the scalars rounded on the host as the CPU rounds them).
// Each update is one pass over its leaf, bound by memory traffic; float4 accesses where
// every pointer is 16-byte aligned. Measured on an H200 (130M elements): adam 4.0 TB/s,
// scale 4.0 TB/s, sum_squares 2.2 TB/s (with its synchronisation). The multi-leaf forms
// update many leaves per launch (PyTorch's multi_tensor_apply): a table of leaves and
// (leaf, chunk) pairs travels in the kernel's arguments, one block per chunk, each element
// through the per-leaf kernel's own function (same bits). Not yet measured on a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"

namespace distjax::tensor::cuda {
namespace {

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

// Calls f(i) for each i < n that this thread owns (grid-stride), and, when `vec`, first
// f4(k) for each float4 k < n / 4 (elements 4k..4k+3), leaving the tail to f.
// What for_each hands block `b` of a grid of `blocks` blocks.
template <class F4, class F>
__device__ void for_each_as(std::int64_t b, std::int64_t blocks, std::int64_t n, bool vec, F4&& f4,
                            F&& f) {
  const std::int64_t stride = blocks * blockDim.x;
  const std::int64_t t = b * blockDim.x + threadIdx.x;
  const std::int64_t nv = vec ? n / 4 : 0;
  for (std::int64_t k = t; k < nv; k += stride)
    f4(k);
  for (std::int64_t i = 4 * nv + t; i < n; i += stride)
    f(i);
}

template <class F4, class F>
__device__ void for_each(std::int64_t n, bool vec, F4&& f4, F&& f) {
  for_each_as(blockIdx.x, gridDim.x, n, vec, f4, f);
}

__device__ float sgd_one(float p, float g, float lr, float wd) {
  return p - lr * (g + wd * p);
}

// p[i] -= lr * (g[i] + wd * p[i]). Bound: 12 bytes moved per element.
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, std::int64_t n,
                           float lr, float wd, bool vec) {
  for_each(
      n, vec,
      [&](std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(p)[k];
        const float4 gv = reinterpret_cast<const float4*>(g)[k];
        pv.x = sgd_one(pv.x, gv.x, lr, wd);
        pv.y = sgd_one(pv.y, gv.y, lr, wd);
        pv.z = sgd_one(pv.z, gv.z, lr, wd);
        pv.w = sgd_one(pv.w, gv.w, lr, wd);
        reinterpret_cast<float4*>(p)[k] = pv;
      },
      [&](std::int64_t i) { p[i] = sgd_one(p[i], g[i], lr, wd); });
}

// One element of SGD with momentum: updates p and b (the buffer) in place.
__device__ void momentum_one(float& p, float g, float& b, float lr, float mu, float wd,
                             bool nesterov) {
  const float gi = g + wd * p;
  const float bi = mu * b + gi;
  b = bi;
  p -= lr * (nesterov ? gi + mu * bi : bi);
}

// g' = g + wd * p; buf = mu * buf + g'; p -= lr * (nesterov ? g' + mu * buf : buf).
// Bound: 20 bytes moved per element.
__global__ void sgd_momentum_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ buf, std::int64_t n, float lr, float mu,
                                    float wd, bool nesterov, bool vec) {
  for_each(
      n, vec,
      [&](std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(p)[k];
        float4 bv = reinterpret_cast<float4*>(buf)[k];
        const float4 gv = reinterpret_cast<const float4*>(g)[k];
        momentum_one(pv.x, gv.x, bv.x, lr, mu, wd, nesterov);
        momentum_one(pv.y, gv.y, bv.y, lr, mu, wd, nesterov);
        momentum_one(pv.z, gv.z, bv.z, lr, mu, wd, nesterov);
        momentum_one(pv.w, gv.w, bv.w, lr, mu, wd, nesterov);
        reinterpret_cast<float4*>(p)[k] = pv;
        reinterpret_cast<float4*>(buf)[k] = bv;
      },
      [&](std::int64_t i) { momentum_one(p[i], g[i], buf[i], lr, mu, wd, nesterov); });
}

// Adam's scalars, rounded to f32 on the host exactly as cpu/optim.cpp rounds them.
struct AdamScalars {
  float step_size, inv_sqrt_bc2, b1, b2, c1, c2, eps, decay, l2;
};

// One element of the Adam/AdamW step, cpu/optim.cpp's expression for expression.
__device__ void adam_one(float& p, float g, float& m, float& v, const AdamScalars& a) {
  const float pi = p * a.decay;
  const float gi = g + a.l2 * pi;
  const float mi = a.b1 * m + a.c1 * gi;
  const float vi = a.b2 * v + a.c2 * gi * gi;
  m = mi;
  v = vi;
  p = pi - a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
}

// The fused Adam/AdamW step. Bound: 28 bytes moved per element (p, m, v read and written,
// g read).
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, std::int64_t n,
                            AdamScalars a, bool vec) {
  for_each(
      n, vec,
      [&](std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(p)[k];
        float4 mv = reinterpret_cast<float4*>(m)[k];
        float4 vv = reinterpret_cast<float4*>(v)[k];
        const float4 gv = reinterpret_cast<const float4*>(g)[k];
        adam_one(pv.x, gv.x, mv.x, vv.x, a);
        adam_one(pv.y, gv.y, mv.y, vv.y, a);
        adam_one(pv.z, gv.z, mv.z, vv.z, a);
        adam_one(pv.w, gv.w, mv.w, vv.w, a);
        reinterpret_cast<float4*>(p)[k] = pv;
        reinterpret_cast<float4*>(m)[k] = mv;
        reinterpret_cast<float4*>(v)[k] = vv;
      },
      [&](std::int64_t i) { adam_one(p[i], g[i], m[i], v[i], a); });
}

// The multi-leaf launches. A leaf is cut into chunks of kChunk elements (a multiple of 4, so
// a chunk of an aligned leaf starts aligned); each block of a launch updates one chunk.
constexpr std::int64_t kChunk = 65536;
constexpr int kTableLeaves = 36;  // PyTorch's depth-4 table: 36 tensors, 320 blocks
constexpr int kTableBlocks = 320;

// One launch's leaves and its blocks' (leaf, chunk) pairs, passed by value as a kernel
// argument (under the 4 KB every architecture takes; no copy to the device, no sync).
struct ChunkTable {
  float* p[kTableLeaves];
  const float* g[kTableLeaves];
  float* m[kTableLeaves];
  float* v[kTableLeaves];
  std::int64_t n[kTableLeaves];
  float decay[kTableLeaves];  // Adam's per-leaf decoupled multiplier, rounded as adam() does
  bool vec[kTableLeaves];     // every pointer of the leaf 16-byte aligned
  std::uint8_t leaf[kTableBlocks];
  std::int32_t chunk[kTableBlocks];
};
static_assert(sizeof(ChunkTable) + sizeof(AdamScalars) + 16 <= 4096,
              "a kernel's arguments must fit in 4 KB");

// Calls f4(leaf, k) for each float4 k of this block's chunk (when the leaf is vectorised),
// then f(leaf, i) for the chunk's remaining elements i; blockDim-strided. The elements and
// their functions are those of the per-leaf kernels' for_each.
template <class F4, class F>
__device__ void for_each_in_chunk(const ChunkTable& t, F4&& f4, F&& f) {
  const int leaf = t.leaf[blockIdx.x];
  const std::int64_t begin = std::int64_t(t.chunk[blockIdx.x]) * kChunk;
  const std::int64_t end = t.n[leaf] < begin + kChunk ? t.n[leaf] : begin + kChunk;
  const std::int64_t nv = t.vec[leaf] ? (end - begin) / 4 : 0;
  for (std::int64_t k = threadIdx.x; k < nv; k += blockDim.x)
    f4(leaf, begin / 4 + k);
  for (std::int64_t i = begin + 4 * nv + threadIdx.x; i < end; i += blockDim.x)
    f(leaf, i);
}

// sgd_kernel on the table's chunks. Bound: 12 bytes moved per element.
__global__ void sgd_many_kernel(const __grid_constant__ ChunkTable t, float lr, float wd) {
  for_each_in_chunk(
      t,
      [&](int l, std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(t.p[l])[k];
        const float4 gv = reinterpret_cast<const float4*>(t.g[l])[k];
        pv.x = sgd_one(pv.x, gv.x, lr, wd);
        pv.y = sgd_one(pv.y, gv.y, lr, wd);
        pv.z = sgd_one(pv.z, gv.z, lr, wd);
        pv.w = sgd_one(pv.w, gv.w, lr, wd);
        reinterpret_cast<float4*>(t.p[l])[k] = pv;
      },
      [&](int l, std::int64_t i) { t.p[l][i] = sgd_one(t.p[l][i], t.g[l][i], lr, wd); });
}

// sgd_momentum_kernel on the table's chunks (m is the buffer). Bound: 20 bytes per element.
__global__ void sgd_momentum_many_kernel(const __grid_constant__ ChunkTable t, float lr, float mu,
                                         float wd, bool nesterov) {
  for_each_in_chunk(
      t,
      [&](int l, std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(t.p[l])[k];
        float4 bv = reinterpret_cast<float4*>(t.m[l])[k];
        const float4 gv = reinterpret_cast<const float4*>(t.g[l])[k];
        momentum_one(pv.x, gv.x, bv.x, lr, mu, wd, nesterov);
        momentum_one(pv.y, gv.y, bv.y, lr, mu, wd, nesterov);
        momentum_one(pv.z, gv.z, bv.z, lr, mu, wd, nesterov);
        momentum_one(pv.w, gv.w, bv.w, lr, mu, wd, nesterov);
        reinterpret_cast<float4*>(t.p[l])[k] = pv;
        reinterpret_cast<float4*>(t.m[l])[k] = bv;
      },
      [&](int l, std::int64_t i) {
        momentum_one(t.p[l][i], t.g[l][i], t.m[l][i], lr, mu, wd, nesterov);
      });
}

// adam_kernel on the table's chunks, each leaf with its own decay. Bound: 28 bytes per
// element.
__global__ void adam_many_kernel(const __grid_constant__ ChunkTable t, AdamScalars shared) {
  AdamScalars a = shared;
  a.decay = t.decay[t.leaf[blockIdx.x]];
  for_each_in_chunk(
      t,
      [&](int l, std::int64_t k) {
        float4 pv = reinterpret_cast<float4*>(t.p[l])[k];
        float4 mv = reinterpret_cast<float4*>(t.m[l])[k];
        float4 vv = reinterpret_cast<float4*>(t.v[l])[k];
        const float4 gv = reinterpret_cast<const float4*>(t.g[l])[k];
        adam_one(pv.x, gv.x, mv.x, vv.x, a);
        adam_one(pv.y, gv.y, mv.y, vv.y, a);
        adam_one(pv.z, gv.z, mv.z, vv.z, a);
        adam_one(pv.w, gv.w, mv.w, vv.w, a);
        reinterpret_cast<float4*>(t.p[l])[k] = pv;
        reinterpret_cast<float4*>(t.m[l])[k] = mv;
        reinterpret_cast<float4*>(t.v[l])[k] = vv;
      },
      [&](int l, std::int64_t i) { adam_one(t.p[l][i], t.g[l][i], t.m[l][i], t.v[l][i], a); });
}

// x[i] *= f. Bound: 8 bytes moved per element.
__device__ void scale_elements(float* __restrict__ x, std::int64_t n, float f, bool vec) {
  for_each(
      n, vec,
      [&](std::int64_t k) {
        float4 xv = reinterpret_cast<float4*>(x)[k];
        xv.x *= f;
        xv.y *= f;
        xv.z *= f;
        xv.w *= f;
        reinterpret_cast<float4*>(x)[k] = xv;
      },
      [&](std::int64_t i) { x[i] *= f; });
}

__global__ void scale_kernel(float* __restrict__ x, std::int64_t n, float f, bool vec) {
  scale_elements(x, n, f, vec);
}

// The factor is read from device memory (a clip factor the device computed).
__global__ void scale_by_kernel(float* __restrict__ x, std::int64_t n,
                                const float* __restrict__ factor, bool vec) {
  scale_elements(x, n, *factor, vec);
}

// Thread 0 gets the block's sum of v (a fixed tree; blockDim.x a multiple of 32, at most
// 1024).
__device__ double block_sum(double v) {
  __shared__ double shared[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1)
    v += __shfl_down_sync(0xffffffffu, v, off);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1)
      v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

// The sum in f64 of x[i]^2 over the elements block b of a grid of `blocks` owns (grid-
// stride, float4 loads when `vec`), reduced over the block by block_sum (thread 0 holds
// it). Bound: 4 bytes read per element.
__device__ double squares_of_block(const float* __restrict__ x, std::int64_t n, bool vec,
                                   std::int64_t b, std::int64_t blocks) {
  double acc = 0.0;
  for_each_as(
      b, blocks, n, vec,
      [&](std::int64_t k) {
        const float4 q = reinterpret_cast<const float4*>(x)[k];
        acc += static_cast<double>(q.x) * q.x;
        acc += static_cast<double>(q.y) * q.y;
        acc += static_cast<double>(q.z) * q.z;
        acc += static_cast<double>(q.w) * q.w;
      },
      [&](std::int64_t i) { acc += static_cast<double>(x[i]) * x[i]; });
  return block_sum(acc);
}

// *out = the sum of partial[b], b < blocks, by one block (a fixed order).
__device__ void fold_partials(const double* __restrict__ partial, int blocks,
                              double* __restrict__ out) {
  double acc = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x)
    acc += partial[b];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

// Sums of squares, many leaves in two launches: per-block partials (a leaf's block count
// depends on its size only), then one block per leaf adds its partials, each in a fixed
// order. A table of up to kSquaresLeaves leaves travels in the kernels' arguments.
constexpr int kSquaresLeaves = 64;
struct SquaresTable {
  const float* x[kSquaresLeaves];
  std::int64_t n[kSquaresLeaves];
  std::int64_t first_block[kSquaresLeaves + 1];  // leaf i owns blocks [first[i], first[i+1])
  bool vec[kSquaresLeaves];
};
static_assert(sizeof(SquaresTable) + 32 <= 4096, "a kernel's arguments must fit in 4 KB");

// Block b: its leaf's partial (partials are laid out like the blocks).
__global__ void sum_squares_partial_many(const __grid_constant__ SquaresTable t, int leaves,
                                         double* __restrict__ partials) {
  const std::int64_t b = blockIdx.x;
  int i = 0;
  while (i + 1 < leaves && t.first_block[i + 1] <= b)
    ++i;
  const std::int64_t blocks = t.first_block[i + 1] - t.first_block[i];
  const double acc = squares_of_block(t.x[i], t.n[i], t.vec[i], b - t.first_block[i], blocks);
  if (threadIdx.x == 0) partials[b] = acc;
}

// Block i: leaf i's partials folded into out[i].
__global__ void sum_partials_many(const __grid_constant__ SquaresTable t,
                                  const double* __restrict__ partials, double* __restrict__ out) {
  const int i = blockIdx.x;
  fold_partials(partials + t.first_block[i],
                static_cast<int>(t.first_block[i + 1] - t.first_block[i]), out + i);
}

// Fills chunk tables with the leaves' chunks in order and calls launch(table, blocks) for
// each full one and the last: ceil(total chunks / 320) launches when leaves are large, one
// per 36 leaves at most when they are small. A leaf cut by a full table goes on in the next
// one from slot 0. Empty leaves take no slot.
template <class Launch>
void for_each_chunk_table(const detail::OptimLeaf* leaves, std::int64_t count, Launch&& launch) {
  ChunkTable t{};
  int slot = 0, blocks = 0;  // the current leaf's slot; blocks filled
  auto set_slot = [&](int to, const detail::OptimLeaf& l) {
    t.p[to] = l.p;
    t.g[to] = l.g;
    t.m[to] = l.m;
    t.v[to] = l.v;
    t.n[to] = l.n;
    t.decay[to] = static_cast<float>(l.decay);
    t.vec[to] =
        aligned16(l.p) && aligned16(l.g) && (!l.m || aligned16(l.m)) && (!l.v || aligned16(l.v));
  };
  for (std::int64_t i = 0; i < count; ++i) {
    const detail::OptimLeaf& l = leaves[i];
    if (l.n == 0) continue;
    set_slot(slot, l);
    const std::int64_t chunks = (l.n + kChunk - 1) / kChunk;
    for (std::int64_t c = 0; c < chunks; ++c) {
      t.leaf[blocks] = static_cast<std::uint8_t>(slot);
      t.chunk[blocks] = static_cast<std::int32_t>(c);
      ++blocks;
      const bool last = c + 1 == chunks;
      if (blocks == kTableBlocks || (last && slot + 1 == kTableLeaves)) {
        launch(t, blocks);
        blocks = 0;
        if (last) {
          slot = -1;  // the next leaf starts the empty table
        } else {
          set_slot(0, l);
          slot = 0;
        }
      }
    }
    ++slot;
  }
  if (blocks > 0) launch(t, blocks);
}

// Adam's scalars for step t, rounded to f32 as cpu/optim.cpp rounds them.
AdamScalars adam_scalars(double lr, double b1, double b2, double eps, std::int64_t t, double decay,
                         double l2) {
  // PyTorch's formulation: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps.
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  return {static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(b1),       static_cast<float>(b2),
          static_cast<float>(1.0 - b1), static_cast<float>(1.0 - b2),
          static_cast<float>(eps),      static_cast<float>(decay),
          static_cast<float>(l2)};
}

void sgd(float* p, const float* g, std::int64_t n, float lr, float wd) {
  if (n == 0) return;
  const bool vec = aligned16(p) && aligned16(g);
  sgd_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(p, g, n, lr, wd, vec);
  DISTJAX_CUDA_LAUNCHED("sgd");
}

void sgd_momentum(float* p, const float* g, float* buf, std::int64_t n, float lr, float mu,
                  float wd, bool nesterov) {
  if (n == 0) return;
  const bool vec = aligned16(p) && aligned16(g) && aligned16(buf);
  sgd_momentum_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(
      p, g, buf, n, lr, mu, wd, nesterov, vec);
  DISTJAX_CUDA_LAUNCHED("sgd_momentum");
}

void adam(float* p, const float* g, float* m, float* v, std::int64_t n, double lr, double b1,
          double b2, double eps, std::int64_t t, double decay, double l2) {
  if (n == 0) return;
  const AdamScalars a = adam_scalars(lr, b1, b2, eps, t, decay, l2);
  const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v);
  adam_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(p, g, m, v, n, a, vec);
  DISTJAX_CUDA_LAUNCHED("adam");
}

void sgd_many(const detail::OptimLeaf* leaves, std::int64_t count, float lr, float wd) {
  const cudaStream_t stream = thread_stream();
  for_each_chunk_table(leaves, count, [&](const ChunkTable& t, int blocks) {
    sgd_many_kernel<<<blocks, kThreads, 0, stream>>>(t, lr, wd);
    DISTJAX_CUDA_LAUNCHED("sgd_many");
  });
}

void sgd_momentum_many(const detail::OptimLeaf* leaves, std::int64_t count, float lr, float mu,
                       float wd, bool nesterov) {
  const cudaStream_t stream = thread_stream();
  for_each_chunk_table(leaves, count, [&](const ChunkTable& t, int blocks) {
    sgd_momentum_many_kernel<<<blocks, kThreads, 0, stream>>>(t, lr, mu, wd, nesterov);
    DISTJAX_CUDA_LAUNCHED("sgd_momentum_many");
  });
}

void adam_many(const detail::OptimLeaf* leaves, std::int64_t count, double lr, double b1, double b2,
               double eps, std::int64_t t, double l2) {
  // adam()'s scalars; each leaf's decay is rounded into the table the same way.
  const AdamScalars a = adam_scalars(lr, b1, b2, eps, t, 1.0, l2);
  const cudaStream_t stream = thread_stream();
  for_each_chunk_table(leaves, count, [&](const ChunkTable& table, int blocks) {
    adam_many_kernel<<<blocks, kThreads, 0, stream>>>(table, a);
    DISTJAX_CUDA_LAUNCHED("adam_many");
  });
}

// results[i] = leaf i's sum of squares, i < count, in device memory: two launches per
// kSquaresLeaves leaves.
void sums_of_squares_into(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                          double* results, cudaStream_t stream) {
  constexpr int kMaxPartials = 1024;
  for (std::int64_t at = 0; at < count; at += kSquaresLeaves) {
    const int leaves = static_cast<int>(std::min<std::int64_t>(kSquaresLeaves, count - at));
    SquaresTable t{};
    t.first_block[0] = 0;
    for (int i = 0; i < leaves; ++i) {
      const std::int64_t n = ns[at + i];
      t.x[i] = xs[at + i];
      t.n[i] = n;
      t.vec[i] = aligned16(xs[at + i]);
      const std::int64_t blocks =
          n == 0 ? 0 : std::min<unsigned>(grid_for(t.vec[i] ? n / 4 : n), kMaxPartials);
      t.first_block[i + 1] = t.first_block[i] + blocks;
    }
    const std::int64_t total = t.first_block[leaves];
    StreamScratch partials(
        sizeof(double) * static_cast<std::size_t>(std::max<std::int64_t>(total, 1)), stream,
        "sum_squares");
    if (total > 0) {
      sum_squares_partial_many<<<static_cast<unsigned>(total), kThreads, 0, stream>>>(
          t, leaves, partials.as<double>());
      DISTJAX_CUDA_LAUNCHED("sum_squares");
    }
    sum_partials_many<<<leaves, kMaxPartials, 0, stream>>>(t, partials.as<double>(), results + at);
    DISTJAX_CUDA_LAUNCHED("sum_squares");
    partials.release();
  }
}

// Every leaf's sum into one device array, then one copy to the host and one wait.
void sum_squares_many(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                      double* host_out) {
  if (count == 0) return;
  const cudaStream_t stream = thread_stream();
  StreamScratch results(sizeof(double) * static_cast<std::size_t>(count), stream, "sum_squares");
  sums_of_squares_into(xs, ns, count, results.as<double>(), stream);
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(host_out, results.as<double>(),
                                     sizeof(double) * static_cast<std::size_t>(count),
                                     cudaMemcpyDeviceToHost, stream),
                     "sum_squares");
  results.release();
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(stream), "sum_squares");
}

// One thread: the leaves' sums added in order, the norm and the clip factor, in the host's
// f64 arithmetic (IEEE sqrt and division round the same on both).
__global__ void norm_and_clip_factor_kernel(const double* __restrict__ sums, std::int64_t count,
                                            double max_norm, float* __restrict__ norm_out,
                                            float* __restrict__ factor_out) {
  double total = 0.0;
  for (std::int64_t i = 0; i < count; ++i)
    total += sums[i];
  const double norm = sqrt(total);
  *norm_out = static_cast<float>(norm);
  *factor_out = max_norm > 0.0 && norm > max_norm ? static_cast<float>(max_norm / norm) : 1.0f;
}

void norm_and_clip_factor(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                          double max_norm, float* norm_out, float* factor_out) {
  const cudaStream_t stream = thread_stream();
  StreamScratch sums(sizeof(double) * static_cast<std::size_t>(std::max<std::int64_t>(count, 1)),
                     stream, "norm_and_clip_factor");
  sums_of_squares_into(xs, ns, count, sums.as<double>(), stream);
  norm_and_clip_factor_kernel<<<1, 1, 0, stream>>>(sums.as<double>(), count, max_norm, norm_out,
                                                   factor_out);
  DISTJAX_CUDA_LAUNCHED("norm_and_clip_factor");
  sums.release();
}

void sum_squares(const float* x, std::int64_t n, double* host_out) {
  sum_squares_many(&x, &n, 1, host_out);
}

void scale(float* x, std::int64_t n, float f) {
  if (n == 0) return;
  const bool vec = aligned16(x);
  scale_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(x, n, f, vec);
  DISTJAX_CUDA_LAUNCHED("scale");
}

void scale_by(float* x, std::int64_t n, const float* factor) {
  if (n == 0) return;
  const bool vec = aligned16(x);
  scale_by_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(x, n, factor, vec);
  DISTJAX_CUDA_LAUNCHED("scale_by");
}

}  // namespace

const detail::UpdateKernels update_kernels{
    .sgd = sgd,
    .sgd_momentum = sgd_momentum,
    .adam = adam,
    .sgd_many = sgd_many,
    .sgd_momentum_many = sgd_momentum_many,
    .adam_many = adam_many,
    .sum_squares = sum_squares,
    .sum_squares_many = sum_squares_many,
    .scale = scale,
    .norm_and_clip_factor = norm_and_clip_factor,
    .scale_by = scale_by,
};

}  // namespace distjax::tensor::cuda
