// CUDA kernels of the attention family (see table/attention.hpp and cpu/attention.cpp), f32,
// FlashAttention-style: no (T, S) matrix in global memory.
//
// Forward: a block owns 64 query rows of one head and walks the key tiles its rows can see
// (a causal block stops at its last row's last key), with the Q tile and each K, V tile
// in shared memory and a running (max, sum) per row (online softmax). It writes o and the
// row log-sum-exp (lse; -inf and o = 0 for a row that sees no key).
// Backward: delta = rowsum(dO * O) first; then one kernel per key tile accumulates dK and
// dV over the query tiles that see it, and one per query tile accumulates dQ over its key
// tiles, both recomputing P = exp(S - lse). Each sum runs in a fixed order: deterministic,
// no atomics.
//
// Tiles are 64 x 64 with 256 threads; thread (ty, tx) = (tid / 16, tid % 16) holds score
// rows ty + 16 i and columns tx + 16 j (i, j < 4) and output rows ty + 16 i. Head sizes up to
// 128 run in these kernels with D padded by zeros to 16, 32, 64 or 128 (shared-memory rows
// of D + 4 floats keep the 16-byte reads free of bank conflicts); larger heads fall back to
// a simple kernel with one warp per row. Bounds: FLOPs (f32 FMA, 4 T S D per head forward,
// about 10 T S D backward, halved by a causal mask). On an H200 (f32 FMA peak about 67
// TFLOP/s), GPT-2 124M's attention (B 8, H 12, T 1024, D 64, causal, packed) takes 0.47 ms
// forward (27 TFLOP/s) and 1.7 ms backward (19 TFLOP/s counting 2.5x the forward's FLOPs).
//
// Document ids (AttentionPlan::segments) mask the scores of keys in other documents like
// the causal mask does, read per entry (no tile is skipped for them yet); with ids no tile
// counts as fully visible.
//
// Plans that allow bf16 products (AttentionPlan::bf16_products, the bf16 policy's
// attention) go to the tensor-core kernels of attention_mma.cu instead, where they serve
// the plan (heads up to 128); delta is computed here for both. Before either, the op asks
// the bf16 entries (attention_cudnn.cpp: cuDNN's fused attention on bf16 copies).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/attention_common.cuh"
#include "distjax/tensor/cuda/attention_cudnn.hpp"
#include "distjax/tensor/cuda/attention_mma.hpp"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda {
namespace attn {
namespace {

using detail::AttentionPlan;

constexpr int kTile = 64;        // query rows and keys per tile
constexpr int kBlock = 256;      // threads per tiled block: 16 x 16
constexpr int kLdP = kTile + 4;  // row stride of a score tile in shared memory

// ------------------------------------------------------------------ tile helpers

__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float component(const float4& f, int e) {
  return e == 0 ? f.x : e == 1 ? f.y : e == 2 ? f.z : f.w;
}

// Rows [0, rows) of a (64, d) operand (rows ld floats apart from g) into a shared tile of
// 64 rows of DP + 4 floats, zero beyond `rows` and d. vec: g, ld and d allow 16-byte reads.
template <int DP>
__device__ __forceinline__ void load_tile(float* sm, const float* __restrict__ g, std::int64_t ld,
                                          std::int64_t rows, std::int64_t d, bool vec) {
  constexpr int kC4 = DP / 4;
  for (int slot = threadIdx.x; slot < kTile * kC4; slot += kBlock) {
    const int r = slot / kC4, c = slot % kC4 * 4;
    *reinterpret_cast<float4*>(sm + r * (DP + 4) + c) = load_quad(g, ld, r, c, rows, d, vec);
  }
}

// c[i][j] = sum over the DP columns of a row (ty + 16 i) of tile a and row (tx + 16 j) of
// tile b (both 64 x (DP + 4)): a 64 x 64 block of A B^T, 16 entries per thread.
template <int DP>
__device__ __forceinline__ void dot_tile(const float* a, const float* b, float c[4][4]) {
  constexpr int kLd = DP + 4;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      c[i][j] = 0.f;
#pragma unroll 4
  for (int k = 0; k < DP; k += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      av[i] = *reinterpret_cast<const float4*>(a + (ty + 16 * i) * kLd + k);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      bv[j] = *reinterpret_cast<const float4*>(b + (tx + 16 * j) * kLd + k);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float s = c[i][j];
        s = fmaf(av[i].x, bv[j].x, s);
        s = fmaf(av[i].y, bv[j].y, s);
        s = fmaf(av[i].z, bv[j].z, s);
        s = fmaf(av[i].w, bv[j].w, s);
        c[i][j] = s;
      }
  }
}

// The output column of a thread's jj-th accumulator (jj < DP / 16): for DP >= 64, groups
// of 4 columns (16-byte reads and writes), else one column every 16.
template <int DP>
__device__ __forceinline__ int out_col(int tx, int jj) {
  if constexpr (DP >= 64)
    return jj / 4 * 64 + tx * 4 + jj % 4;
  else
    return tx + 16 * jj;
}

// acc[i][jj] += sum over the 64 columns c of score tile p's row (ty + 16 i) times row c of
// tile x (64 x (DP + 4)) at column out_col(jj): a 64 x DP block of P X.
template <int DP>
__device__ __forceinline__ void mul_tile(const float* p, const float* x, float acc[4][DP / 16]) {
  constexpr int kLd = DP + 4, kCols = DP / 16;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 2
  for (int c = 0; c < kTile; c += 4) {
    float4 pv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      pv[i] = *reinterpret_cast<const float4*>(p + (ty + 16 * i) * kLdP + c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float* xr = x + (c + e) * kLd;
      float xv[kCols];
      if constexpr (DP >= 64) {
#pragma unroll
        for (int g = 0; g < kCols / 4; ++g) {
          const float4 f = *reinterpret_cast<const float4*>(xr + g * 64 + tx * 4);
          xv[4 * g] = f.x;
          xv[4 * g + 1] = f.y;
          xv[4 * g + 2] = f.z;
          xv[4 * g + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < kCols; ++jj)
          xv[jj] = xr[tx + 16 * jj];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pe = component(pv[i], e);
#pragma unroll
        for (int jj = 0; jj < kCols; ++jj)
          acc[i][jj] = fmaf(pe, xv[jj], acc[i][jj]);
      }
    }
  }
}

// Writes a thread's accumulators of one output row times `mul` to row (columns < d).
template <int DP>
__device__ __forceinline__ void store_row(float* row, const float (&acc)[DP / 16], float mul,
                                          std::int64_t d, bool vec) {
  constexpr int kCols = DP / 16;
  const int tx = threadIdx.x % 16;
  if constexpr (DP >= 64) {
    if (vec) {
#pragma unroll
      for (int g = 0; g < kCols / 4; ++g) {
        const int col = out_col<DP>(tx, 4 * g);
        if (col < d)
          *reinterpret_cast<float4*>(row + col) = make_float4(
              acc[4 * g] * mul, acc[4 * g + 1] * mul, acc[4 * g + 2] * mul, acc[4 * g + 3] * mul);
      }
      return;
    }
  }
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) {
    const int col = out_col<DP>(tx, jj);
    if (col < d) row[col] = acc[jj] * mul;
  }
}

// Shared memory of the tiled kernels: `tiles` operand tiles and one score tile.
template <int DP>
constexpr std::size_t smem_bytes(int tiles) {
  return (std::size_t(tiles) * kTile * (DP + 4) + std::size_t(kTile) * kLdP) * sizeof(float);
}

// ------------------------------------------------------------------ forward

// Block x: query tile (tiles - 1 - x / bh) of head x % bh (the causal mask's heaviest
// tiles start first). Shared: Q, K, V tiles and the P tile.
template <int DP>
__global__ void __launch_bounds__(kBlock)
    forward_kernel(const AttentionPlan a, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
                   bool vec) {
  constexpr int kLd = DP + 4, kCols = DP / 16;
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + kTile * kLd;
  float* vs = ks + kTile * kLd;
  float* ps = vs + kTile * kLd;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const auto [h, t0, rows] = query_tile(a, kTile);
  const float* kh = k + a.kv_at(h);
  const float* vh = v + a.kv_at(h);
  load_tile<DP>(qs, q + a.q_at(h) + t0 * a.ldq, a.ldq, rows, a.d, vec);

  const std::int64_t kmax = a.visible(t0 + rows - 1);  // keys the tile's last row sees
  const std::int64_t vis_first = a.visible(t0);        // keys every row of the tile sees
  const float sl2 = a.scale * kLog2e;                   // scores in base 2
  std::int64_t vis[4];
  float m[4], l[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    vis[i] = a.visible(t0 + ty + 16 * i);
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj)
      acc[i][jj] = 0.f;
  }

  for (std::int64_t j0 = 0; j0 < kmax; j0 += kTile) {
    __syncthreads();  // the previous tile's K, V and P are read
    const std::int64_t keys = min(std::int64_t(kTile), a.s - j0);
    load_tile<DP>(ks, kh + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
    load_tile<DP>(vs, vh + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
    __syncthreads();
    float sc[4][4];
    dot_tile<DP>(qs, ks, sc);
    const bool full = a.segments == nullptr && j0 + kTile <= vis_first;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
      const std::int64_t row = t0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float x = sc[i][j] * sl2;
        const std::int64_t col = j0 + tx + 16 * j;
        // col < vis[i] <= s; rows past T are never stored.
        if (!full && (col >= vis[i] || (row < a.t && !a.same_document(h, row, col))))
          x = -INFINITY;
        sc[i][j] = x;
        mx = fmaxf(mx, x);
      }
      mx = half_warp_max(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet
      const float alpha = exp2f(m[i] - m_use);
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = exp2f(sc[i][j] - m_use);
        ps[(ty + 16 * i) * kLdP + tx + 16 * j] = p;
        rs += p;
      }
      rs = half_warp_sum(rs);
      l[i] = l[i] * alpha + rs;
      m[i] = m_new;
#pragma unroll
      for (int jj = 0; jj < kCols; ++jj)
        acc[i][jj] *= alpha;
    }
    __syncthreads();
    mul_tile<DP>(ps, vs, acc);
  }

  float* oh = o + a.o_at(h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = t0 + ty + 16 * i;
    if (row >= a.t) continue;
    store_row<DP>(oh + row * a.ldo, acc[i], l[i] > 0.f ? 1.f / l[i] : 0.f, a.d, vec);
    if (tx == 0) lse[h * a.t + row] = l[i] > 0.f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
  }
}

// ------------------------------------------------------------------ backward

// delta (bh, T) = rowsum(dO * O), one warp per row. Bound: 8 bytes per element of o.
__global__ void delta_kernel(const AttentionPlan a, const float* __restrict__ o,
                             const float* __restrict__ go, float* __restrict__ delta) {
  const int lane = threadIdx.x % 32;
  const std::int64_t rows = a.bh * a.t;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < rows;
       w += warps) {
    const std::int64_t h = w / a.t, i = w % a.t;
    const std::int64_t at = a.o_at(h) + i * a.ldo;
    float acc = 0.f;
    for (std::int64_t c = lane; c < a.d; c += 32)
      acc += go[at + c] * o[at + c];
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
      acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[w] = acc;
  }
}

// dQ of query tile (tiles - 1 - x / bh) of head x % bh: dQ = scale dS K over the key tiles
// the rows see, dS = P * (dP - delta), P = exp(S - lse), dP = dO V^T. Shared: Q, dO, K, V
// tiles and the dS tile.
template <int DP>
__global__ void __launch_bounds__(kBlock)
    backward_dq_kernel(const AttentionPlan a, const float* __restrict__ q,
                       const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ go, const float* __restrict__ lse,
                       const float* __restrict__ delta, float* __restrict__ dq, bool vec) {
  constexpr int kLd = DP + 4, kCols = DP / 16;
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* dos = qs + kTile * kLd;
  float* ks = dos + kTile * kLd;
  float* vs = ks + kTile * kLd;
  float* ps = vs + kTile * kLd;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const auto [h, t0, rows] = query_tile(a, kTile);
  const float* kh = k + a.kv_at(h);
  const float* vh = v + a.kv_at(h);
  load_tile<DP>(qs, q + a.q_at(h) + t0 * a.ldq, a.ldq, rows, a.d, vec);
  load_tile<DP>(dos, go + a.o_at(h) + t0 * a.ldo, a.ldo, rows, a.d, vec);

  const std::int64_t kmax = a.visible(t0 + rows - 1);
  const std::int64_t vis_first = a.visible(t0);
  const float sl2 = a.scale * kLog2e;
  std::int64_t vis[4];
  float lse2[4], dd[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = t0 + ty + 16 * i;
    const bool inside = row < a.t;
    vis[i] = inside ? a.visible(row) : 0;
    lse2[i] = inside ? lse[h * a.t + row] * kLog2e : 0.f;
    dd[i] = inside ? delta[h * a.t + row] : 0.f;
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj)
      acc[i][jj] = 0.f;
  }

  for (std::int64_t j0 = 0; j0 < kmax; j0 += kTile) {
    __syncthreads();
    const std::int64_t keys = min(std::int64_t(kTile), a.s - j0);
    load_tile<DP>(ks, kh + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
    load_tile<DP>(vs, vh + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
    __syncthreads();
    float sc[4][4], dp[4][4];
    dot_tile<DP>(qs, ks, sc);
    dot_tile<DP>(dos, vs, dp);
    const bool full = a.segments == nullptr && j0 + kTile <= vis_first;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t row = t0 + ty + 16 * i, col = j0 + tx + 16 * j;
        const bool seen =
            full || (col < vis[i] && row < a.t && a.same_document(h, row, col));
        const float p = seen ? exp2f(sc[i][j] * sl2 - lse2[i]) : 0.f;
        ps[(ty + 16 * i) * kLdP + tx + 16 * j] = p * (dp[i][j] - dd[i]);
      }
    __syncthreads();
    mul_tile<DP>(ps, ks, acc);
  }

  float* dqh = dq + a.q_at(h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = t0 + ty + 16 * i;
    if (row < a.t) store_row<DP>(dqh + row * a.ldq, acc[i], a.scale, a.d, vec);
  }
}

// dK and dV of key tile x / bh of head x % bh (the causal mask's heaviest tiles first):
// over the query tiles that see it, dV += P^T dO and dK += scale dS^T Q, with P^T and dS^T
// computed key-major (keys are the tile's rows). Shared: K, V, Q, dO tiles and a score
// tile (P^T, then dS^T).
template <int DP>
__global__ void __launch_bounds__(kBlock)
    backward_dkdv_kernel(const AttentionPlan a, const float* __restrict__ q,
                         const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ go, const float* __restrict__ lse,
                         const float* __restrict__ delta, float* __restrict__ dk,
                         float* __restrict__ dv, bool vec) {
  constexpr int kLd = DP + 4, kCols = DP / 16;
  extern __shared__ float4 smem4[];
  float* ks = reinterpret_cast<float*>(smem4);
  float* vs = ks + kTile * kLd;
  float* qs = vs + kTile * kLd;
  float* dos = qs + kTile * kLd;
  float* ps = dos + kTile * kLd;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const std::int64_t h = blockIdx.x % a.bh;
  const std::int64_t j0 = std::int64_t(blockIdx.x / a.bh) * kTile;
  const std::int64_t keys = min(std::int64_t(kTile), a.s - j0);
  load_tile<DP>(ks, k + a.kv_at(h) + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
  load_tile<DP>(vs, v + a.kv_at(h) + j0 * a.ldkv, a.ldkv, keys, a.d, vec);
  const float* qh = q + a.q_at(h);
  const float* gh = go + a.o_at(h);

  const float sl2 = a.scale * kLog2e;
  float dk_acc[4][kCols], dv_acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) {
      dk_acc[i][jj] = 0.f;
      dv_acc[i][jj] = 0.f;
    }
  // The first query that sees key j0: visible(i) > j0 from i = first_row(j0) on.
  const std::int64_t first = a.first_row(j0);
  for (std::int64_t t0 = first / kTile * kTile; t0 < a.t; t0 += kTile) {
    __syncthreads();  // the previous tile's Q, dO and dS^T are read
    const std::int64_t rows = min(std::int64_t(kTile), a.t - t0);
    load_tile<DP>(qs, qh + t0 * a.ldq, a.ldq, rows, a.d, vec);
    load_tile<DP>(dos, gh + t0 * a.ldo, a.ldo, rows, a.d, vec);
    std::int64_t vis[4];
    float lse2[4], dd[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t row = t0 + tx + 16 * j;
      const bool inside = row < a.t;
      vis[j] = inside ? a.visible(row) : 0;
      lse2[j] = inside ? lse[h * a.t + row] * kLog2e : 0.f;
      dd[j] = inside ? delta[h * a.t + row] : 0.f;
    }
    __syncthreads();
    float sc[4][4], dp[4][4];
    dot_tile<DP>(ks, qs, sc);   // S^T
    dot_tile<DP>(vs, dos, dp);  // dP^T
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t key = j0 + ty + 16 * i;  // vis[j] is 0 for rows past T
        const bool seen = key < vis[j] && a.same_document(h, t0 + tx + 16 * j, key);
        const float p = seen ? exp2f(sc[i][j] * sl2 - lse2[j]) : 0.f;
        sc[i][j] = p;
        dp[i][j] = p * (dp[i][j] - dd[j]);
        ps[(ty + 16 * i) * kLdP + tx + 16 * j] = p;
      }
    __syncthreads();
    mul_tile<DP>(ps, dos, dv_acc);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        ps[(ty + 16 * i) * kLdP + tx + 16 * j] = dp[i][j];
    __syncthreads();
    mul_tile<DP>(ps, qs, dk_acc);
  }

  float* dkh = dk + a.kv_at(h);
  float* dvh = dv + a.kv_at(h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t key = j0 + ty + 16 * i;
    if (key >= a.s) continue;
    store_row<DP>(dkh + key * a.ldkv, dk_acc[i], a.scale, a.d, vec);
    store_row<DP>(dvh + key * a.ldkv, dv_acc[i], 1.f, a.d, vec);
  }
}

// ------------------------------------------------------------------ heads over 128

// Head sizes over 128: one warp per row, the running sums kept in the output rows (global
// memory, owned by the warp). Correct but slow; no tuned model uses such heads.

__device__ __forceinline__ float warp_dot(const float* x, const float* y, std::int64_t d) {
  float acc = 0.f;
  for (std::int64_t c = threadIdx.x % 32; c < d; c += 32)
    acc += x[c] * y[c];
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// Warp w: query row w % T of head w / T.
__global__ void forward_rows_kernel(const AttentionPlan a, const float* __restrict__ q,
                                    const float* __restrict__ k, const float* __restrict__ v,
                                    float* __restrict__ o, float* __restrict__ lse) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < a.bh * a.t;
       w += warps) {
    const std::int64_t h = w / a.t, i = w % a.t;
    const float* qr = q + a.q_at(h) + i * a.ldq;
    float* orow = o + a.o_at(h) + i * a.ldo;
    for (std::int64_t c = lane; c < a.d; c += 32)
      orow[c] = 0.f;
    float m = -INFINITY, l = 0.f;
    const std::int64_t n = a.visible(i);
    for (std::int64_t j = 0; j < n; ++j) {
      if (!a.same_document(h, i, j)) continue;
      const float* kr = k + a.kv_at(h) + j * a.ldkv;
      const float* vr = v + a.kv_at(h) + j * a.ldkv;
      const float s = warp_dot(qr, kr, a.d) * a.scale;
      const float m_new = fmaxf(m, s);
      const float alpha = expf(m - m_new), p = expf(s - m_new);
      l = l * alpha + p;
      m = m_new;
      for (std::int64_t c = lane; c < a.d; c += 32)
        orow[c] = orow[c] * alpha + p * vr[c];
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (std::int64_t c = lane; c < a.d; c += 32)
      orow[c] *= inv;
    if (lane == 0) lse[w] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

// Warp w: dQ of query row w % T of head w / T.
__global__ void backward_dq_rows_kernel(const AttentionPlan a, const float* __restrict__ q,
                                        const float* __restrict__ k, const float* __restrict__ v,
                                        const float* __restrict__ go, const float* __restrict__ lse,
                                        const float* __restrict__ delta, float* __restrict__ dq) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < a.bh * a.t;
       w += warps) {
    const std::int64_t h = w / a.t, i = w % a.t;
    const float* qr = q + a.q_at(h) + i * a.ldq;
    const float* gr = go + a.o_at(h) + i * a.ldo;
    float* dqr = dq + a.q_at(h) + i * a.ldq;
    for (std::int64_t c = lane; c < a.d; c += 32)
      dqr[c] = 0.f;
    const std::int64_t n = a.visible(i);
    for (std::int64_t j = 0; j < n; ++j) {
      if (!a.same_document(h, i, j)) continue;
      const float* kr = k + a.kv_at(h) + j * a.ldkv;
      const float* vr = v + a.kv_at(h) + j * a.ldkv;
      const float p = expf(warp_dot(qr, kr, a.d) * a.scale - lse[w]);
      const float ds = p * (warp_dot(gr, vr, a.d) - delta[w]);
      for (std::int64_t c = lane; c < a.d; c += 32)
        dqr[c] += ds * kr[c];
    }
    for (std::int64_t c = lane; c < a.d; c += 32)
      dqr[c] *= a.scale;
  }
}

// Warp w: dK and dV of key row w % S of head w / S, over the queries that see it in order.
__global__ void backward_dkdv_rows_kernel(const AttentionPlan a, const float* __restrict__ q,
                                          const float* __restrict__ k, const float* __restrict__ v,
                                          const float* __restrict__ go,
                                          const float* __restrict__ lse,
                                          const float* __restrict__ delta, float* __restrict__ dk,
                                          float* __restrict__ dv) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < a.bh * a.s;
       w += warps) {
    const std::int64_t h = w / a.s, j = w % a.s;
    const float* kr = k + a.kv_at(h) + j * a.ldkv;
    const float* vr = v + a.kv_at(h) + j * a.ldkv;
    float* dkr = dk + a.kv_at(h) + j * a.ldkv;
    float* dvr = dv + a.kv_at(h) + j * a.ldkv;
    for (std::int64_t c = lane; c < a.d; c += 32) {
      dkr[c] = 0.f;
      dvr[c] = 0.f;
    }
    const std::int64_t first = a.first_row(j);
    for (std::int64_t i = first; i < a.t; ++i) {
      if (j >= a.visible(i) || !a.same_document(h, i, j)) continue;
      const float* qr = q + a.q_at(h) + i * a.ldq;
      const float* gr = go + a.o_at(h) + i * a.ldo;
      const float p = expf(warp_dot(qr, kr, a.d) * a.scale - lse[h * a.t + i]);
      const float ds = p * (warp_dot(gr, vr, a.d) - delta[h * a.t + i]);
      for (std::int64_t c = lane; c < a.d; c += 32) {
        dvr[c] += p * gr[c];
        dkr[c] += ds * qr[c];
      }
    }
    for (std::int64_t c = lane; c < a.d; c += 32)
      dkr[c] *= a.scale;
  }
}

// ------------------------------------------------------------------ launchers

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Whether every row of every operand starts 16-byte aligned, so tiles move in 16-byte packs.
bool vec_ok(const AttentionPlan& a, std::initializer_list<const void*> ptrs) {
  for (std::int64_t x : {a.d, a.ldq, a.ldkv, a.ldo, a.q_b, a.q_h, a.kv_b, a.kv_h, a.o_b, a.o_h})
    if (x % 4 != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// The tiled kernel's head size: d padded to 16, 32, 64 or 128 (0 for larger heads).
int padded_d(std::int64_t d) {
  return d <= 16 ? 16 : d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 0;
}

template <int DP>
void forward_tiled(const AttentionPlan& a, const float* q, const float* k, const float* v, float* o,
                   float* lse, cudaStream_t st) {
  const bool vec = vec_ok(a, {q, k, v, o});
  const std::size_t smem = smem_bytes<DP>(3);
  allow_smem(forward_kernel<DP>, smem, "attention");
  const unsigned blocks = tile_blocks(a, (a.t + kTile - 1) / kTile, "attention");
  forward_kernel<DP><<<blocks, kBlock, smem, st>>>(a, q, k, v, o, lse, vec);
  DISTJAX_CUDA_LAUNCHED("attention");
}

template <int DP>
void backward_tiled(const AttentionPlan& a, const float* q, const float* k, const float* v,
                    const float* lse, const float* go, const float* delta, float* dq, float* dk,
                    float* dv, cudaStream_t st) {
  const bool vec = vec_ok(a, {q, k, v, go, dq, dk, dv});
  const std::size_t smem = smem_bytes<DP>(4);
  if (a.t > 0) {
    allow_smem(backward_dq_kernel<DP>, smem, "attention_backward");
    const unsigned blocks = tile_blocks(a, (a.t + kTile - 1) / kTile, "attention_backward");
    backward_dq_kernel<DP><<<blocks, kBlock, smem, st>>>(a, q, k, v, go, lse, delta, dq, vec);
    DISTJAX_CUDA_LAUNCHED("attention_backward");
  }
  if (a.s > 0) {  // with T == 0 too: dK and dV are then 0
    allow_smem(backward_dkdv_kernel<DP>, smem, "attention_backward");
    const unsigned blocks = tile_blocks(a, (a.s + kTile - 1) / kTile, "attention_backward");
    backward_dkdv_kernel<DP><<<blocks, kBlock, smem, st>>>(a, q, k, v, go, lse, delta, dk, dv, vec);
    DISTJAX_CUDA_LAUNCHED("attention_backward");
  }
}

void forward(const AttentionPlan& a, const float* q, const float* k, const float* v, float* o,
             float* lse) {
  if (a.bh == 0 || a.t == 0) return;
  const cudaStream_t st = thread_stream();
  if (attn_mma::serves(a)) return attn_mma::forward(a, q, k, v, o, lse, vec_ok(a, {q, k, v, o}), st);
  switch (padded_d(a.d)) {
    case 16:
      return forward_tiled<16>(a, q, k, v, o, lse, st);
    case 32:
      return forward_tiled<32>(a, q, k, v, o, lse, st);
    case 64:
      return forward_tiled<64>(a, q, k, v, o, lse, st);
    case 128:
      return forward_tiled<128>(a, q, k, v, o, lse, st);
    default:
      forward_rows_kernel<<<grid_for(a.bh * a.t * 32), kThreads, 0, st>>>(a, q, k, v, o, lse);
      DISTJAX_CUDA_LAUNCHED("attention");
  }
}

void backward(const AttentionPlan& a, const float* q, const float* k, const float* v,
              const float* o, const float* lse, const float* go, float* dq, float* dk, float* dv) {
  if (a.bh == 0 || a.d == 0 || (a.t == 0 && a.s == 0)) return;
  const cudaStream_t st = thread_stream();
  const std::int64_t rows = a.bh * a.t;
  float* delta = nullptr;
  if (rows > 0) {
    void* scratch = nullptr;
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, std::size_t(rows) * sizeof(float), st),
                       "attention_backward", "delta scratch of ", rows, " floats");
    delta = static_cast<float*>(scratch);
    delta_kernel<<<grid_for(rows * 32), kThreads, 0, st>>>(a, o, go, delta);
    DISTJAX_CUDA_LAUNCHED("attention_backward");
  }
  if (attn_mma::serves(a)) {
    attn_mma::backward(a, q, k, v, lse, go, delta, dq, dk, dv,
                       vec_ok(a, {q, k, v, go, dq, dk, dv}), st);
  } else {
    switch (padded_d(a.d)) {
      case 16:
        backward_tiled<16>(a, q, k, v, lse, go, delta, dq, dk, dv, st);
        break;
      case 32:
        backward_tiled<32>(a, q, k, v, lse, go, delta, dq, dk, dv, st);
        break;
      case 64:
        backward_tiled<64>(a, q, k, v, lse, go, delta, dq, dk, dv, st);
        break;
      case 128:
        backward_tiled<128>(a, q, k, v, lse, go, delta, dq, dk, dv, st);
        break;
      default:
        if (rows > 0) {
          backward_dq_rows_kernel<<<grid_for(rows * 32), kThreads, 0, st>>>(a, q, k, v, go, lse,
                                                                            delta, dq);
          DISTJAX_CUDA_LAUNCHED("attention_backward");
        }
        if (a.s > 0) {
          backward_dkdv_rows_kernel<<<grid_for(a.bh * a.s * 32), kThreads, 0, st>>>(
              a, q, k, v, go, lse, delta, dk, dv);
          DISTJAX_CUDA_LAUNCHED("attention_backward");
        }
    }
  }
  if (delta) DISTJAX_CUDA_CHECK(cudaFreeAsync(delta, st), "attention_backward");
}

// The online-softmax merge, one warp per row: every lane computes the row's two weights
// from the old log-sum-exps, then lane 0 writes the new one once the row is merged.
__global__ void merge_kernel(std::int64_t rows, std::int64_t d, float* __restrict__ o,
                             float* __restrict__ lse, const float* __restrict__ ob,
                             const float* __restrict__ lseb) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
       r += warps) {
    const float l1 = lse[r], l2 = lseb[r];
    if (l2 == -INFINITY) continue;  // the block saw nothing for this row
    const float m = fmaxf(l1, l2);
    const float l = l1 == -INFINITY ? l2 : m + logf(expf(l1 - m) + expf(l2 - m));
    const float w1 = l1 == -INFINITY ? 0.f : expf(l1 - l), w2 = expf(l2 - l);
    float* orow = o + r * d;
    const float* brow = ob + r * d;
    for (std::int64_t c = lane; c < d; c += 32)
      orow[c] = l1 == -INFINITY ? brow[c] : w1 * orow[c] + w2 * brow[c];
    __syncwarp();  // every lane has read lse[r]
    if (lane == 0) lse[r] = l;
  }
}

void merge(std::int64_t rows, std::int64_t d, float* o, float* lse, const float* ob,
           const float* lseb) {
  if (rows == 0) return;
  merge_kernel<<<grid_for(rows * 32), kThreads, 0, thread_stream()>>>(rows, d, o, lse, ob, lseb);
  DISTJAX_CUDA_LAUNCHED("attention_merge");
}

}  // namespace
}  // namespace attn

const detail::AttentionKernels attention_kernels{
    .forward = attn::forward,
    .backward = attn::backward,
    .merge = attn::merge,
    .serves_bf16 = cudnn_attention::serves,
    .forward_bf16 = cudnn_attention::forward,
    .backward_bf16 = cudnn_attention::backward,
};

}  // namespace distjax::tensor::cuda
