// CUDA kernels of the nn family over rows (see table/nn.hpp and cpu/nn.cpp): softmax and
// log_softmax, layer and RMS norm, cross-entropy, each with its backward; and the family's
// kernel table, which takes embedding (nn_embedding.cu) and dropout (nn_dropout.cu) from
// their files. A block owns a row (grid-stride over rows), reads it in 16-byte packs where
// the alignment allows, and reduces it with warp shuffles in a fixed order (deterministic).
// The parameter gradients of the norms sum rows in chunks into a scratch, then the chunks
// in order (no float atomics). Bounds are bytes moved; measured on one H200 (4.8 TB/s) at
// GPT-2 124M sizes, noted at each kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/column_sums.cuh"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/nn.cuh"

namespace distjax::tensor::cuda {
namespace nn {
namespace {

// ------------------------------------------------------------------ online log-sum-exp

// A running (max, sum of exp(x - max)) pair; a max of -inf stands for an empty sum.
struct MaxSum {
  float m = -INFINITY;
  float s = 0.f;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  const float sa = a.m == -INFINITY ? 0.f : a.s * expf(a.m - m);
  const float sb = b.m == -INFINITY ? 0.f : b.s * expf(b.m - m);
  return {m, sa + sb};
}

// Adds a pack's values to the running pair (one rescale per pack).
template <int V>
__device__ __forceinline__ MaxSum add_pack(MaxSum a, const Pack<V>& x) {
  float pm = x.v[0];
#pragma unroll
  for (int e = 1; e < V; ++e)
    pm = fmaxf(pm, x.v[e]);
  if (pm == -INFINITY) return a;
  const float m = fmaxf(a.m, pm);
  float s = a.m == -INFINITY ? 0.f : a.s * expf(a.m - m);
#pragma unroll
  for (int e = 0; e < V; ++e)
    s += expf(x.v[e] - m);
  return {m, s};
}

// The block's (max, sum) of every thread's pair, returned to every thread in a fixed order.
// rm, rs: 32 floats of shared memory each.
__device__ MaxSum block_max_sum(MaxSum a, float* rm, float* rs) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    a = combine(a,
                {__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)});
  if (lane == 0) {
    rm[warp] = a.m;
    rs[warp] = a.s;
  }
  __syncthreads();
  a = lane < int(blockDim.x / 32) ? MaxSum{rm[lane], rs[lane]} : MaxSum{};
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    a = combine(a,
                {__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)});
  __syncthreads();
  return a;
}

// logsumexp of a row from its (max, sum): -inf for an empty or all -inf row.
__device__ __forceinline__ float lse_of(MaxSum a) {
  return a.m == -INFINITY ? -INFINITY : a.m + logf(a.s);
}

// ------------------------------------------------------------------ softmax

// y = softmax(x) or log_softmax(x) per row: the row's max, then its sum of exp(x - max),
// then the write (plain block reductions: cheaper than a running pair for short rows).
// Bound: 8 bytes per element (the later reads hit L1/L2 for rows up to ~1 MB); 2.2 TB/s
// at 8192 x 768 on an H200.
template <int V>
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, std::int64_t n,
                               std::int64_t c, bool log_form) {
  __shared__ float red[32];
  const std::int64_t cv = c / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float m = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        m = fmaxf(m, p.v[e]);
    }
    m = block_max(m, red);
    float s = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        s += expf(p.v[e] - m);
    }
    s = block_sum(s, red);
    const float lse = m == -INFINITY ? -INFINITY : m + logf(s);
    const float inv = 1.f / s;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        p.v[e] = log_form ? p.v[e] - lse : expf(p.v[e] - m) * inv;
      store_pack<V>(yr, j, p);
    }
  }
}

// gx = g - exp(y) sum(g) (log_form) or y (g - <g, y>) per row. Bound: 12 bytes per element.
template <int V>
__global__ void softmax_backward_kernel(const float* __restrict__ y, const float* __restrict__ g,
                                        float* __restrict__ gx, std::int64_t n, std::int64_t c,
                                        bool log_form) {
  __shared__ float red[32];
  const std::int64_t cv = c / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* yr = y + r * c;
    const float* gr = g + r * c;
    float* o = gx + r * c;
    float s = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> gp = load_pack<V>(gr, j);
      if (log_form) {
#pragma unroll
        for (int e = 0; e < V; ++e)
          s += gp.v[e];
      } else {
        const Pack<V> yp = load_pack<V>(yr, j);
#pragma unroll
        for (int e = 0; e < V; ++e)
          s += gp.v[e] * yp.v[e];
      }
    }
    s = block_sum(s, red);
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> gp = load_pack<V>(gr, j);
      Pack<V> yp = load_pack<V>(yr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        yp.v[e] = log_form ? gp.v[e] - expf(yp.v[e]) * s : yp.v[e] * (gp.v[e] - s);
      store_pack<V>(o, j, yp);
    }
  }
}

void softmax(const float* x, float* y, std::int64_t n, std::int64_t c, bool log_form) {
  if (n == 0 || c == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(c);
  if (packs_of_4(c, {x, y}))
    softmax_kernel<4><<<row_blocks(n), threads, 0, st>>>(x, y, n, c, log_form);
  else
    softmax_kernel<1><<<row_blocks(n), threads, 0, st>>>(x, y, n, c, log_form);
  DISTJAX_CUDA_LAUNCHED("softmax");
}

void softmax_backward(const float* y, const float* g, float* gx, std::int64_t n, std::int64_t c,
                      bool log_form) {
  if (n == 0 || c == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(c);
  if (packs_of_4(c, {y, g, gx}))
    softmax_backward_kernel<4><<<row_blocks(n), threads, 0, st>>>(y, g, gx, n, c, log_form);
  else
    softmax_backward_kernel<1><<<row_blocks(n), threads, 0, st>>>(y, g, gx, n, c, log_form);
  DISTJAX_CUDA_LAUNCHED("softmax_backward");
}

// ------------------------------------------------------------------ norms

// y = (x - mean) rstd gamma (+ beta) per row, mean and rstd saved; as the CPU, the variance
// is the mean of (x - mean)^2 (a second pass). Bound: 8 bytes per element; 2.3 TB/s at
// 8192 x 768 on an H200.
// Pack j of a row of Out: f32 as store_pack; bf16 rounded as distjax::bf16(float) does
// (V = 4: one 8-byte store).
template <int V>
__device__ __forceinline__ void store_out(float* p, std::int64_t j, const Pack<V>& x) {
  store_pack<V>(p, j, x);
}
template <int V>
__device__ __forceinline__ void store_out(Bf16* p, std::int64_t j, const Pack<V>& x) {
  if constexpr (V == 4) {
    store_bf16x4(p, j, x.v[0], x.v[1], x.v[2], x.v[3]);
  } else {
    p[j] = bf16_from_f32(x.v[0]);
  }
}
// f16 rounded as distjax::f16(float) does (V = 4: one 8-byte store).
template <int V>
__device__ __forceinline__ void store_out(F16* p, std::int64_t j, const Pack<V>& x) {
  if constexpr (V == 4) {
    ushort4 u;
    u.x = f16_from_f32(x.v[0]).bits;
    u.y = f16_from_f32(x.v[1]).bits;
    u.z = f16_from_f32(x.v[2]).bits;
    u.w = f16_from_f32(x.v[3]).bits;
    reinterpret_cast<ushort4*>(p)[j] = u;
  } else {
    p[j] = f16_from_f32(x.v[0]);
  }
}

template <int V, class Out>
__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                  const float* __restrict__ beta, Out* __restrict__ y,
                                  float* __restrict__ mean, float* __restrict__ rstd,
                                  std::int64_t n, std::int64_t c, float eps) {
  __shared__ float red[32];
  const std::int64_t cv = c / V;
  const float inv_c = 1.f / static_cast<float>(c);
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * c;
    Out* yr = y + r * c;
    float s = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        s += p.v[e];
    }
    const float m = block_sum(s, red) * inv_c;
    float var = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        var += (p.v[e] - m) * (p.v[e] - m);
    }
    const float rs = 1.f / sqrtf(block_sum(var, red) * inv_c + eps);
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      Pack<V> p = load_pack<V>(xr, j);
      const Pack<V> w = load_pack<V>(gamma, j);
      if (beta) {
        const Pack<V> b = load_pack<V>(beta, j);
#pragma unroll
        for (int e = 0; e < V; ++e)
          p.v[e] = (p.v[e] - m) * rs * w.v[e] + b.v[e];
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          p.v[e] = (p.v[e] - m) * rs * w.v[e];
      }
      store_out<V>(yr, j, p);
    }
  }
}

// gx = rstd (g gamma - mean_c(g gamma) - xh mean_c(g gamma xh)) per row, xh the normalised
// x (layer norm: (x - mean) rstd; RMS norm, mean == null: x rstd, and no mean_c(g gamma)
// term); g f32 or bf16 (G). Bound: 12 bytes per element (10 with a bf16 g).
// With `part` (each thread owning at most one pack of a row: c / V <= blockDim.x), the
// parameter gradients' partial sums over the block's rows come too, in the pass that writes
// gx: part[block][column] = sum of g xh (dgamma), part[blocks + block][column] = sum of g
// (dbeta, with_beta), without reading x and g again.
template <int V, class G>
__global__ void norm_backward_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                     const G* __restrict__ g, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, float* gx, const float* add,
                                     std::int64_t n, std::int64_t c, float* __restrict__ part,
                                     bool with_beta) {
  __shared__ float red[32];
  const std::int64_t cv = c / V;
  const float inv_c = 1.f / static_cast<float>(c);
  float pw[V] = {}, pb[V] = {};  // this thread's pack's parameter sums (with part)
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * c;
    const G* gr = g + r * c;
    const float m = mean ? mean[r] : 0.f, rs = rstd[r];
    float a = 0.f, b = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> xp = load_pack<V>(xr, j), gp = load_pack<V>(gr, j), w = load_pack<V>(gamma, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (xp.v[e] - m) * rs;
        const float dxh = gp.v[e] * w.v[e];
        a += dxh;
        b += dxh * xh;
      }
    }
    a = mean ? block_sum(a, red) * inv_c : 0.f;
    b = block_sum(b, red) * inv_c;
    float* o = gx + r * c;
    const float* ar = add ? add + r * c : nullptr;  // may be o: each pack read, then written
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      Pack<V> xp = load_pack<V>(xr, j);
      const Pack<V> gp = load_pack<V>(gr, j), w = load_pack<V>(gamma, j);
      const Pack<V> ap = ar ? load_pack<V>(ar, j) : Pack<V>{};
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (xp.v[e] - m) * rs;
        if (part) {
          pw[e] += gp.v[e] * xh;
          pb[e] += gp.v[e];
        }
        xp.v[e] = rs * (gp.v[e] * w.v[e] - a - xh * b);
        // The partial sum plus the norm's own, rounded as the separate add rounds it.
        if (ar) xp.v[e] = __fadd_rn(ap.v[e], xp.v[e]);
      }
      store_pack<V>(o, j, xp);
    }
  }
  if (!part || threadIdx.x >= cv) return;
  const std::int64_t col = std::int64_t(threadIdx.x) * V;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    part[std::int64_t(blockIdx.x) * c + col + e] = pw[e];
    if (with_beta) part[(std::int64_t(gridDim.x) + blockIdx.x) * c + col + e] = pb[e];
  }
}

// y = x rrms gamma per row, rrms = 1 / sqrt(mean(x^2) + eps) saved. Bound: 8 bytes per
// element.
template <int V>
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                float* __restrict__ y, float* __restrict__ rrms, std::int64_t n,
                                std::int64_t c, float eps) {
  __shared__ float red[32];
  const std::int64_t cv = c / V;
  const float inv_c = 1.f / static_cast<float>(c);
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float s = 0.f;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      const Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        s += p.v[e] * p.v[e];
    }
    const float rs = 1.f / sqrtf(block_sum(s, red) * inv_c + eps);
    if (threadIdx.x == 0) rrms[r] = rs;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x) {
      Pack<V> p = load_pack<V>(xr, j);
      const Pack<V> w = load_pack<V>(gamma, j);
#pragma unroll
      for (int e = 0; e < V; ++e)
        p.v[e] = p.v[e] * rs * w.v[e];
      store_pack<V>(yr, j, p);
    }
  }
}

// The norms' parameter gradients on their own (where no gx is wanted, or a row has more
// packs than a block has threads; else norm_backward_kernel makes them with gx): dgamma =
// sum over rows of g xh, dbeta = sum of g. Block (kColTile, kColLanes) owns kColTile
// columns of one chunk of rows; its lanes take the chunk's rows in turn, then lane sums are
// added in lane order into part[chunk][column] (dgamma) and part[chunks + chunk][column]
// (dbeta, when wanted). Bound: 8 bytes per element (a second read of x and g after the gx
// kernel). Each thread owns V adjacent columns (V = 4: 16-byte loads of x, 8 or 16 of g,
// where c and the buffers allow) and keeps several rows' loads in flight; each column's
// sums run over the same rows in the same order whatever V. (One 4-byte load per thread at
// a time left an H100 at about a third of its bandwidth.)
template <int V, class G>
__global__ void norm_param_partial_kernel(const float* __restrict__ x, const G* __restrict__ g,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, float* __restrict__ part,
                                          std::int64_t n, std::int64_t c, std::int64_t chunk_rows,
                                          bool with_beta) {
  __shared__ float sw[kColLanes][kColTile * V + 1], sb[kColLanes][kColTile * V + 1];
  const std::int64_t col = (std::int64_t(blockIdx.x) * kColTile + threadIdx.x) * V;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < n ? r0 + chunk_rows : n;
  float dw[V] = {}, db[V] = {};
  if (col < c) {  // V = 4 only where c % 4 == 0: then the pack lies inside the row
#pragma unroll 4
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const Pack<V> gp = load_pack<V>(g + r * c, col / V), xp = load_pack<V>(x + r * c, col / V);
      const float m = mean ? mean[r] : 0.f, rs = rstd[r];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (xp.v[e] - m) * rs;
        dw[e] += gp.v[e] * xh;
        db[e] += gp.v[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sw[threadIdx.y][threadIdx.x * V + e] = dw[e];
    sb[threadIdx.y][threadIdx.x * V + e] = db[e];
  }
  __syncthreads();
  if (threadIdx.y != 0 || col >= c) return;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    for (int l = 1; l < kColLanes; ++l) {
      dw[e] += sw[l][threadIdx.x * V + e];
      db[e] += sb[l][threadIdx.x * V + e];
    }
    part[chunk * c + col + e] = dw[e];
    if (with_beta) part[(gridDim.y + chunk) * c + col + e] = db[e];
  }
}

// dgamma (and dbeta when not null) of a norm over x (n, c), deterministic for given n and c:
// the chunking depends on the sizes only.
template <class G>
void norm_param_grads(const float* x, const G* g, const float* mean, const float* rstd,
                      float* dgamma, float* dbeta, std::int64_t n, std::int64_t c, cudaStream_t st,
                      const char* op) {
  const bool v4 = packs_of_4(c, {x, g});
  const std::int64_t width = kColTile * (v4 ? 4 : 1);
  const std::int64_t tiles = (c + width - 1) / width;
  const ColumnChunks cc = column_chunks(n, c);
  const std::int64_t chunks = cc.chunks, chunk_rows = cc.chunk_rows;
  const std::int64_t part_floats = (dbeta ? 2 : 1) * chunks * c;
  void* scratch = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, std::size_t(part_floats) * sizeof(float), st), op,
                     "norm parameter scratch of ", part_floats, " floats");
  float* part = static_cast<float*>(scratch);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  if (v4)
    norm_param_partial_kernel<4><<<grid, dim3(kColTile, kColLanes), 0, st>>>(
        x, g, mean, rstd, part, n, c, chunk_rows, dbeta != nullptr);
  else
    norm_param_partial_kernel<1><<<grid, dim3(kColTile, kColLanes), 0, st>>>(
        x, g, mean, rstd, part, n, c, chunk_rows, dbeta != nullptr);
  DISTJAX_CUDA_LAUNCHED(op);
  column_sums(part, dgamma, dbeta ? part + chunks * c : nullptr, dbeta, c, chunks, st);
  DISTJAX_CUDA_LAUNCHED(op);
  DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, st), op);
}

template <class Out>
void layer_norm_to(const float* x, const float* gamma, const float* beta, Out* y, float* mean,
                   float* rstd, std::int64_t n, std::int64_t c, float eps) {
  if (n == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(c);
  // A bf16 row of 4-packs is 8-byte aligned where its f32 twin would be 16-byte aligned.
  const bool vec = packs_of_4(c, {x, gamma, beta}) &&
                   reinterpret_cast<std::uintptr_t>(y) % (4 * sizeof(Out)) == 0;
  if (vec)
    layer_norm_kernel<4, Out>
        <<<row_blocks(n), threads, 0, st>>>(x, gamma, beta, y, mean, rstd, n, c, eps);
  else
    layer_norm_kernel<1, Out>
        <<<row_blocks(n), threads, 0, st>>>(x, gamma, beta, y, mean, rstd, n, c, eps);
  DISTJAX_CUDA_LAUNCHED("layer_norm");
}

void layer_norm(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                float* rstd, std::int64_t n, std::int64_t c, float eps) {
  layer_norm_to(x, gamma, beta, y, mean, rstd, n, c, eps);
}

void layer_norm_bf16(const float* x, const float* gamma, const float* beta, bf16* y, float* mean,
                     float* rstd, std::int64_t n, std::int64_t c, float eps) {
  layer_norm_to(x, gamma, beta, reinterpret_cast<Bf16*>(y), mean, rstd, n, c, eps);
}

// Blocks of the fused norm backward: 8 per SM of an H100 (a row per block at a time, two
// block reductions per row); the rows' split among them, and so the parameter gradients'
// summation order, depends on n alone.
constexpr std::int64_t kNormBlocks = 132 * 8;

// Either norm's backward (mean == null: RMS norm): gx (when wanted, `add` added into it) and
// the parameter gradients. Where a block's threads cover a row's packs, one kernel makes gx
// and the parameter sums' partials (x and g read once); else the gx kernel and
// norm_param_grads (x and g read twice).
template <class G>
void norm_backward(const float* x, const float* gamma, const G* g, const float* mean,
                   const float* rstd, float* gx, const float* add, float* dgamma, float* dbeta,
                   std::int64_t n, std::int64_t c, cudaStream_t st, const char* op) {
  if (c == 0) return;
  const int threads = row_threads(c);
  const bool v4 = packs_of_4(c, {x, gamma, g, gx, add});
  auto launch = [&](unsigned blocks, float* part) {
    if (v4)
      norm_backward_kernel<4><<<blocks, threads, 0, st>>>(x, gamma, g, mean, rstd, gx, add, n, c,
                                                          part, dbeta != nullptr);
    else
      norm_backward_kernel<1><<<blocks, threads, 0, st>>>(x, gamma, g, mean, rstd, gx, add, n, c,
                                                          part, dbeta != nullptr);
    DISTJAX_CUDA_LAUNCHED(op);
  };
  if (gx && n > 0 && dgamma && c / (v4 ? 4 : 1) <= threads) {
    const std::int64_t blocks = std::min(n, kNormBlocks);
    const std::int64_t part_floats = (dbeta ? 2 : 1) * blocks * c;
    void* scratch = nullptr;
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, std::size_t(part_floats) * sizeof(float), st), op,
                       "norm parameter scratch of ", part_floats, " floats");
    float* part = static_cast<float*>(scratch);
    launch(static_cast<unsigned>(blocks), part);
    column_sums(part, dgamma, dbeta ? part + blocks * c : nullptr, dbeta, c, blocks, st);
    DISTJAX_CUDA_LAUNCHED(op);
    DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, st), op);
    return;
  }
  if (gx && n > 0) launch(row_blocks(n), nullptr);
  norm_param_grads(x, g, mean, rstd, dgamma, dbeta, n, c, st, op);
}

template <class G>
void layer_norm_backward_of(const float* x, const float* gamma, const G* g, const float* mean,
                            const float* rstd, float* gx, const float* add, float* dgamma,
                            float* dbeta, std::int64_t n, std::int64_t c) {
  norm_backward(x, gamma, g, mean, rstd, gx, add, dgamma, dbeta, n, c, thread_stream(),
                "layer_norm_backward");
}

void layer_norm_backward(const float* x, const float* gamma, const float* g, const float* mean,
                         const float* rstd, float* gx, const float* add, float* dgamma,
                         float* dbeta, std::int64_t n, std::int64_t c) {
  layer_norm_backward_of(x, gamma, g, mean, rstd, gx, add, dgamma, dbeta, n, c);
}

void layer_norm_backward_bf16(const float* x, const float* gamma, const bf16* g, const float* mean,
                              const float* rstd, float* gx, const float* add, float* dgamma,
                              float* dbeta, std::int64_t n, std::int64_t c) {
  layer_norm_backward_of(x, gamma, reinterpret_cast<const Bf16*>(g), mean, rstd, gx, add, dgamma,
                         dbeta, n, c);
}

void rms_norm(const float* x, const float* gamma, float* y, float* rrms, std::int64_t n,
              std::int64_t c, float eps) {
  if (n == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(c);
  if (packs_of_4(c, {x, gamma, y}))
    rms_norm_kernel<4><<<row_blocks(n), threads, 0, st>>>(x, gamma, y, rrms, n, c, eps);
  else
    rms_norm_kernel<1><<<row_blocks(n), threads, 0, st>>>(x, gamma, y, rrms, n, c, eps);
  DISTJAX_CUDA_LAUNCHED("rms_norm");
}

void rms_norm_backward(const float* x, const float* gamma, const float* g, const float* rrms,
                       float* gx, float* dgamma, std::int64_t n, std::int64_t c) {
  norm_backward(x, gamma, g, nullptr, rrms, gx, nullptr, dgamma, nullptr, n, c, thread_stream(),
                "rms_norm_backward");
}

// ------------------------------------------------------------------ cross-entropy

// lse[r] = logsumexp(row r) in one pass (a running max and sum per thread), loss[r] =
// lse[r] - row[label]. Bound: 4 bytes per logit; 4.0 TB/s at 8192 x 50304 on an H200.
template <int V, class Id>
__global__ void cross_entropy_kernel(const float* __restrict__ logits,
                                     const Id* __restrict__ labels, float* __restrict__ loss,
                                     float* __restrict__ lse, std::int64_t n, std::int64_t v) {
  __shared__ float rm[32], rs[32];
  const std::int64_t vv = v / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = logits + r * v;
    MaxSum a;
    for (std::int64_t j = threadIdx.x; j < vv; j += blockDim.x)
      a = add_pack<V>(a, load_pack<V>(xr, j));
    a = block_max_sum(a, rm, rs);
    if (threadIdx.x == 0) {
      const float l = lse_of(a);
      lse[r] = l;
      const auto label = static_cast<std::int64_t>(labels[r]);
      loss[r] = label >= 0 && label < v ? l - xr[label] : __int_as_float(0x7fc00000);
    }
  }
}

// One row's gradient by the block, gr (exp(x - l) - onehot(label)), in packs of V written
// in Out: each thread reads its pack before it writes it (o may be xr).
template <int V, class In, class Out>
__device__ __forceinline__ void row_grad(const In* xr, Out* o, float gr, float l,
                                         std::int64_t label, std::int64_t vv) {
  for (std::int64_t j = threadIdx.x; j < vv; j += blockDim.x) {
    Pack<V> p = load_pack<V>(xr, j);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      p.v[e] = gr * expf(p.v[e] - l);
      if (j * V + e == label) p.v[e] -= gr;
    }
    store_out<V>(o, j, p);
  }
}

// gx[r] = g[r] (exp(row - lse[r]) - onehot(label)). Bound: 8 bytes per logit; 4.0 TB/s at
// 8192 x 50304 on an H200. gx may be logits: each thread reads its pack of a row before it
// writes it.
template <int V, class Id>
__global__ void cross_entropy_backward_kernel(const float* logits, const float* __restrict__ g,
                                              const float* __restrict__ lse,
                                              const Id* __restrict__ labels, float* gx,
                                              std::int64_t n, std::int64_t v) {
  const std::int64_t vv = v / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    row_grad<V>(logits + r * v, gx + r * v, g[r], lse[r], static_cast<std::int64_t>(labels[r]), vv);
  }
}

// Both kernels above in one pass over logits in f32 or bf16 (In): a row's (max, sum), then
// its gradient from the row read again (from L2: a block holds one row at a time), written
// in Out. The label's logit is read before the block's barrier, so a gradient written over
// the logits cannot change it. Bound: sizeof(In) bytes read and sizeof(Out) written per
// logit.
template <int V, class In, class Id, class Out>
__global__ void cross_entropy_with_grad_kernel(const In* logits, const Id* __restrict__ labels,
                                               float* __restrict__ loss, float* __restrict__ lse,
                                               const float* __restrict__ g, Out* gx, std::int64_t n,
                                               std::int64_t v) {
  __shared__ float rm[32], rs[32];
  const std::int64_t vv = v / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const In* xr = logits + r * v;
    const std::int64_t label = static_cast<std::int64_t>(labels[r]);
    const bool valid = label >= 0 && label < v;
    const float at_label = threadIdx.x == 0 && valid ? load_f32(xr, label) : 0.f;
    MaxSum a;
    for (std::int64_t j = threadIdx.x; j < vv; j += blockDim.x)
      a = add_pack<V>(a, load_pack<V>(xr, j));
    a = block_max_sum(a, rm, rs);
    const float l = lse_of(a);
    if (threadIdx.x == 0) {
      lse[r] = l;
      loss[r] = valid ? l - at_label : __int_as_float(0x7fc00000);
    }
    row_grad<V>(xr, gx + r * v, g[r], l, label, vv);
  }
}

void cross_entropy_with_grad(const void* logits, DType logits_dtype, const void* labels,
                             DType id_dtype, float* loss, float* lse, const float* g, void* gx,
                             DType gx_dtype, std::int64_t n, std::int64_t v) {
  if (n == 0 || v == 0) return;
  DISTJAX_CHECK(logits_dtype == DType::F32 || logits_dtype == DType::BF16, NotImplemented,
                "[cross_entropy] reads f32 or bf16 logits, not ", dtype_name(logits_dtype));
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(v);
  // Packs of 4: 16-byte (f32) or 8-byte (halves) accesses to the logits and the gradient.
  const auto aligned = [](const void* p, DType t) {
    return reinterpret_cast<std::uintptr_t>(p) % (t == DType::F32 ? 16 : 8) == 0;
  };
  const bool v4 = v % 4 == 0 && aligned(logits, logits_dtype) && aligned(gx, gx_dtype);
  with_ids(labels, id_dtype, [&](const auto* pl) {
    using Id = std::remove_cv_t<std::remove_pointer_t<decltype(pl)>>;
    auto launch = [&](const auto* in, auto* out) {
      using In = std::remove_cv_t<std::remove_pointer_t<decltype(in)>>;
      using Out = std::remove_pointer_t<decltype(out)>;
      if (v4)
        cross_entropy_with_grad_kernel<4, In, Id, Out>
            <<<row_blocks(n), threads, 0, st>>>(in, pl, loss, lse, g, out, n, v);
      else
        cross_entropy_with_grad_kernel<1, In, Id, Out>
            <<<row_blocks(n), threads, 0, st>>>(in, pl, loss, lse, g, out, n, v);
    };
    auto with_out = [&](const auto* in) {
      switch (gx_dtype) {
        case DType::F32:
          return launch(in, static_cast<float*>(gx));
        case DType::BF16:
          return launch(in, static_cast<Bf16*>(gx));
        case DType::F16:
          return launch(in, static_cast<F16*>(gx));
        default:
          DISTJAX_THROW(NotImplemented,
                        "[cross_entropy] writes its gradient in f32, bf16 or f16, not ",
                        dtype_name(gx_dtype));
      }
    };
    if (logits_dtype == DType::F32)
      with_out(static_cast<const float*>(logits));
    else
      with_out(static_cast<const Bf16*>(logits));
  });
  DISTJAX_CUDA_LAUNCHED("cross_entropy_with_grad");
}

void cross_entropy(const float* logits, const void* labels, DType id_dtype, float* loss, float* lse,
                   std::int64_t n, std::int64_t v) {
  if (n == 0 || v == 0) return;  // v == 0 has no valid label (check_ids refuses every id)
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(v);
  const bool v4 = packs_of_4(v, {logits});
  with_ids(labels, id_dtype, [&](const auto* pl) {
    using Id = std::remove_cv_t<std::remove_pointer_t<decltype(pl)>>;
    if (v4)
      cross_entropy_kernel<4, Id><<<row_blocks(n), threads, 0, st>>>(logits, pl, loss, lse, n, v);
    else
      cross_entropy_kernel<1, Id><<<row_blocks(n), threads, 0, st>>>(logits, pl, loss, lse, n, v);
  });
  DISTJAX_CUDA_LAUNCHED("cross_entropy");
}

void cross_entropy_backward(const float* logits, const float* g, const float* lse,
                            const void* labels, DType id_dtype, float* gx, std::int64_t n,
                            std::int64_t v) {
  if (n == 0 || v == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(v);
  const bool v4 = packs_of_4(v, {logits, gx});
  with_ids(labels, id_dtype, [&](const auto* pl) {
    using Id = std::remove_cv_t<std::remove_pointer_t<decltype(pl)>>;
    if (v4)
      cross_entropy_backward_kernel<4, Id>
          <<<row_blocks(n), threads, 0, st>>>(logits, g, lse, pl, gx, n, v);
    else
      cross_entropy_backward_kernel<1, Id>
          <<<row_blocks(n), threads, 0, st>>>(logits, g, lse, pl, gx, n, v);
  });
  DISTJAX_CUDA_LAUNCHED("cross_entropy_backward");
}

}  // namespace
}  // namespace nn

const detail::NnKernels nn_kernels{
    .softmax = nn::softmax,
    .softmax_backward = nn::softmax_backward,
    .layer_norm = nn::layer_norm,
    .layer_norm_bf16 = nn::layer_norm_bf16,
    .layer_norm_backward = nn::layer_norm_backward,
    .layer_norm_backward_bf16 = nn::layer_norm_backward_bf16,
    .rms_norm = nn::rms_norm,
    .rms_norm_backward = nn::rms_norm_backward,
    .find_bad_id = nn::find_bad_id,
    .embedding = nn::embedding,
    .embedding_backward = nn::embedding_backward,
    .cross_entropy = nn::cross_entropy,
    .cross_entropy_backward = nn::cross_entropy_backward,
    .cross_entropy_with_grad = nn::cross_entropy_with_grad,
    .dropout = nn::dropout,
};

}  // namespace distjax::tensor::cuda
