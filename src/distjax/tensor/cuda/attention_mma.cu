// The attention family's kernels for bf16 products (AttentionPlan::bf16_products), on the
// tensor cores, FlashAttention-2's way: no (T, S) matrix in global memory, an online softmax
// held in registers.
//
// Operands stay f32 in global memory (q, k, v, o, their gradients, lse): each tile is read
// as f32 and rounded to bf16 in shared memory. Both products of each step run as
// mma.sync.m16n8k16 (bf16 operands, f32 accumulation); the probabilities (and, backward,
// dS) are rounded to bf16 for the second product, as the tensor cores need. The softmax,
// its running max and sum, lse and delta stay f32.
//
// A block has 4 warps and owns 64 rows (query rows forward and for dQ; keys for dK and
// dV), 16 per warp; it walks the other side in tiles of 64. A warp's accumulators follow
// the m16n8 C fragment: lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of its 16,
// columns 2t and 2t + 1 of each 8-wide n tile. A C fragment of two adjacent n tiles is the
// A fragment of one k16 step, so the probabilities pass from the first product to the
// second without touching shared memory. Shared tiles keep rows of D + 8 bf16 (16 bytes
// of padding): the fragment reads then hit 32 distinct banks.
//
// Backward: one kernel per query tile accumulates dQ over its key tiles, one per key tile
// accumulates dK and dV over the query tiles that see it; both recompute S and dP. Every
// sum runs in a fixed order (deterministic, no atomics).
#include "distjax/tensor/cuda/attention_mma.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/attention_common.cuh"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda::attn_mma {
namespace {

using detail::AttentionPlan;

constexpr int kRows = 64;      // a block's own rows: 16 per warp
constexpr int kTile = 64;      // the rows of each tile it walks
constexpr int kThreads = 128;  // 4 warps

// bf16 elements per shared row of a tile of head size DP.
template <int DP>
constexpr int kLd = DP + 8;

// ------------------------------------------------------------------ helpers

__device__ __forceinline__ std::int64_t min64(std::int64_t x, std::int64_t y) {
  return x < y ? x : y;
}
__device__ __forceinline__ std::int64_t max64(std::int64_t x, std::int64_t y) {
  return x > y ? x : y;
}


// ------------------------------------------------------------------ fragments

// Two bf16 (lo in the low half) in one register.
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  std::uint32_t r;
  std::memcpy(&r, &h, sizeof r);
  return r;
}
// Elements p[0] and p[1] (p even).
__device__ __forceinline__ std::uint32_t pair(const __nv_bfloat16* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
// *lo and *hi, from two rows.
__device__ __forceinline__ std::uint32_t two(const __nv_bfloat16* lo, const __nv_bfloat16* hi) {
  return std::uint32_t(__bfloat16_as_ushort(*lo)) |
         (std::uint32_t(__bfloat16_as_ushort(*hi)) << 16);
}

// c += a b: a 16 x 16 (row), b 16 x 8 (col), bf16; c 16 x 8, f32.
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // serves() keeps such GPUs on the f32 kernels
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The A fragment of rows [r0, r0 + 16) and columns [k0, k0 + 16) of a shared tile.
template <int DP>
__device__ __forceinline__ void load_a(std::uint32_t (&f)[4], const __nv_bfloat16* x, int r0,
                                       int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const __nv_bfloat16* p = x + (r0 + g) * kLd<DP> + k0 + 2 * t;
  f[0] = pair(p);
  f[1] = pair(p + 8 * kLd<DP>);
  f[2] = pair(p + 8);
  f[3] = pair(p + 8 * kLd<DP> + 8);
}

// The A fragment of k step kk from the C fragments of n tiles 2 kk and 2 kk + 1.
__device__ __forceinline__ void c_to_a(std::uint32_t (&f)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  f[0] = pack(lo[0], lo[1]);
  f[1] = pack(lo[2], lo[3]);
  f[2] = pack(hi[0], hi[1]);
  f[3] = pack(hi[2], hi[3]);
}

// acc[n] += A y^T over the DP columns: A = rows [r0, r0 + 16) of tile x, n tiles over the
// 64 rows of tile y (both shared, DP columns): 16 x 64 scores of x's rows against y's.
template <int DP>
__device__ __forceinline__ void scores(float (&acc)[8][4], const __nv_bfloat16* x, int r0,
                                       const __nv_bfloat16* y) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    std::uint32_t f[4];
    load_a<DP>(f, x, r0, kk * 16);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const __nv_bfloat16* p = y + (n * 8 + g) * kLd<DP> + kk * 16 + 2 * t;
      mma(acc[n], f, pair(p), pair(p + 8));
    }
  }
}

// acc[dn] += P y over 64 rows of tile y: P (16 x 64) in C fragments p, y (64 x DP) shared.
template <int DP>
__device__ __forceinline__ void times_tile(float (&acc)[DP / 8][4], const float (&p)[8][4],
                                           const __nv_bfloat16* y) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  constexpr int L = kLd<DP>;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    std::uint32_t f[4];
    c_to_a(f, p[2 * kk], p[2 * kk + 1]);
    const __nv_bfloat16* r = y + (kk * 16 + 2 * t) * L + g;
#pragma unroll
    for (int dn = 0; dn < DP / 8; ++dn) {
      const __nv_bfloat16* c = r + dn * 8;
      mma(acc[dn], f, two(c, c + L), two(c + 8 * L, c + 9 * L));
    }
  }
}

// Rows [0, rows) of an operand (rows ld floats apart from src) into a shared tile of 64
// rows of DP bf16, zero beyond `rows` and d. vec: src, ld and d allow 16-byte reads.
template <int DP>
__device__ __forceinline__ void load_tile(__nv_bfloat16* sm, const float* __restrict__ src,
                                          std::int64_t ld_src, std::int64_t rows, std::int64_t d,
                                          bool vec) {
  constexpr int kC4 = DP / 4;
  for (int slot = threadIdx.x; slot < kTile * kC4; slot += kThreads) {
    const int r = slot / kC4, c = slot % kC4 * 4;
    const float4 val = load_quad(src, ld_src, r, c, rows, d, vec);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(sm + r * kLd<DP> + c);
    out[0] = __floats2bfloat162_rn(val.x, val.y);
    out[1] = __floats2bfloat162_rn(val.z, val.w);
  }
}

// Writes a warp's accumulators of its rows r_lo and r_lo + 8 (lane's), times mul_lo and
// mul_hi, to dst (rows ld_dst floats apart, `rows` of them valid, d columns).
template <int DP>
__device__ __forceinline__ void store_rows(float* __restrict__ dst, std::int64_t ld_dst,
                                           const float (&acc)[DP / 8][4], int r_lo,
                                           std::int64_t rows, std::int64_t d, float mul_lo,
                                           float mul_hi) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + 8 * half;
    if (r >= rows) continue;
    const float mul = half ? mul_hi : mul_lo;
    float* row = dst + std::int64_t(r) * ld_dst;
#pragma unroll
    for (int dn = 0; dn < DP / 8; ++dn)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = dn * 8 + 2 * t + e;
        if (c < d) row[c] = acc[dn][2 * half + e] * mul;
      }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int DP>
constexpr std::size_t smem_bytes(int tiles) {
  return std::size_t(tiles) * kTile * kLd<DP> * sizeof(__nv_bfloat16);
}

// Block x: query tile (tiles - 1 - x / bh) of head x % bh (a causal mask's heaviest tiles
// start first). Shared: the Q tile and one K and one V tile.
template <int DP>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const AttentionPlan a, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
                   bool vec) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + kTile * kLd<DP>;
  __nv_bfloat16* vs = ks + kTile * kLd<DP>;
  const auto [h, row0, rows] = query_tile(a, kRows);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float* kh = k + a.kv_at(h);
  const float* vh = v + a.kv_at(h);
  load_tile<DP>(qs, q + a.q_at(h) + row0 * a.ldq, a.ldq, rows, a.d, vec);

  // This lane's two rows (local r_lo and r_lo + 8) and the keys each sees.
  const int r_lo = warp * 16 + g;
  const std::int64_t vis_lo = r_lo < rows ? a.visible(row0 + r_lo) : 0;
  const std::int64_t vis_hi = r_lo + 8 < rows ? a.visible(row0 + r_lo + 8) : 0;
  const std::int64_t keys = a.visible(row0 + rows - 1);  // the block's last row sees most
  const float c = a.scale * kLog2e;                        // scores in log2 units
  float acc[DP / 8][4] = {};
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  for (std::int64_t key0 = 0; key0 < keys; key0 += kTile) {
    __syncthreads();  // the last tile's readers are done (and Q is in)
    const std::int64_t n_keys = min64(kTile, a.s - key0);
    load_tile<DP>(ks, kh + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
    load_tile<DP>(vs, vh + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
    __syncthreads();
    float s[8][4];
    scores<DP>(s, qs, warp * 16, ks);
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t col = key0 + n * 8 + 2 * t + e;  // visible keys are < s
        s[n][e] = col < vis_lo && a.same_document(h, row0 + r_lo, col) ? s[n][e] * c : -INFINITY;
        s[n][2 + e] =
            col < vis_hi && a.same_document(h, row0 + r_lo + 8, col) ? s[n][2 + e] * c : -INFINITY;
        mx_lo = fmaxf(mx_lo, s[n][e]);
        mx_hi = fmaxf(mx_hi, s[n][2 + e]);
      }
    mx_lo = fmaxf(m_lo, quad_max(mx_lo));
    mx_hi = fmaxf(m_hi, quad_max(mx_hi));
    // A row that has seen no key yet keeps max -inf: exponents from 0 then give 0.
    const float base_lo = mx_lo == -INFINITY ? 0.f : mx_lo;
    const float base_hi = mx_hi == -INFINITY ? 0.f : mx_hi;
    const float alpha_lo = exp2f(m_lo - base_lo), alpha_hi = exp2f(m_hi - base_hi);
    m_lo = mx_lo;
    m_hi = mx_hi;
    l_lo *= alpha_lo;
    l_hi *= alpha_hi;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[n][e] = exp2f(s[n][e] - base_lo);
        s[n][2 + e] = exp2f(s[n][2 + e] - base_hi);
        l_lo += s[n][e];
        l_hi += s[n][2 + e];
      }
#pragma unroll
    for (int dn = 0; dn < DP / 8; ++dn) {
      acc[dn][0] *= alpha_lo;
      acc[dn][1] *= alpha_lo;
      acc[dn][2] *= alpha_hi;
      acc[dn][3] *= alpha_hi;
    }
    times_tile<DP>(acc, s, vs);
  }
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  store_rows<DP>(o + a.o_at(h) + row0 * a.ldo, a.ldo, acc, r_lo, rows, a.d,
                 l_lo > 0.f ? 1.f / l_lo : 0.f, l_hi > 0.f ? 1.f / l_hi : 0.f);
  if (t == 0) {
    float* out = lse + h * a.t + row0;
    if (r_lo < rows) out[r_lo] = l_lo > 0.f ? (m_lo + log2f(l_lo)) * kLn2 : -INFINITY;
    if (r_lo + 8 < rows) out[r_lo + 8] = l_hi > 0.f ? (m_hi + log2f(l_hi)) * kLn2 : -INFINITY;
  }
}

// dQ of query tile (tiles - 1 - x / bh) of head x % bh: dQ = scale dS K over the key tiles
// its rows see, dS = P * (dP - delta), P = exp(S - lse), dP = dO V^T. Shared: the Q and dO
// tiles and one K and one V tile.
template <int DP>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const AttentionPlan a, const float* __restrict__ q, const float* __restrict__ k,
              const float* __restrict__ v, const float* __restrict__ go,
              const float* __restrict__ lse, const float* __restrict__ delta,
              float* __restrict__ dq, bool vec) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* gs = qs + kTile * kLd<DP>;
  __nv_bfloat16* ks = gs + kTile * kLd<DP>;
  __nv_bfloat16* vs = ks + kTile * kLd<DP>;
  const auto [h, row0, rows] = query_tile(a, kRows);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float* kh = k + a.kv_at(h);
  const float* vh = v + a.kv_at(h);
  load_tile<DP>(qs, q + a.q_at(h) + row0 * a.ldq, a.ldq, rows, a.d, vec);
  load_tile<DP>(gs, go + a.o_at(h) + row0 * a.ldo, a.ldo, rows, a.d, vec);

  const int r_lo = warp * 16 + g;
  const std::int64_t vis_lo = r_lo < rows ? a.visible(row0 + r_lo) : 0;
  const std::int64_t vis_hi = r_lo + 8 < rows ? a.visible(row0 + r_lo + 8) : 0;
  // A row that sees no key has lse -inf; its entries are all masked, never exponentiated.
  const float lse_lo = vis_lo > 0 ? lse[h * a.t + row0 + r_lo] * kLog2e : 0.f;
  const float lse_hi = vis_hi > 0 ? lse[h * a.t + row0 + r_lo + 8] * kLog2e : 0.f;
  const float del_lo = vis_lo > 0 ? delta[h * a.t + row0 + r_lo] : 0.f;
  const float del_hi = vis_hi > 0 ? delta[h * a.t + row0 + r_lo + 8] : 0.f;
  const std::int64_t keys = a.visible(row0 + rows - 1);
  const float c = a.scale * kLog2e;
  float acc[DP / 8][4] = {};
  for (std::int64_t key0 = 0; key0 < keys; key0 += kTile) {
    __syncthreads();
    const std::int64_t n_keys = min64(kTile, a.s - key0);
    load_tile<DP>(ks, kh + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
    load_tile<DP>(vs, vh + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
    __syncthreads();
    float s[8][4], dp[8][4];
    scores<DP>(s, qs, warp * 16, ks);
    scores<DP>(dp, gs, warp * 16, vs);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t col = key0 + n * 8 + 2 * t + e;
        const float p_lo = col < vis_lo && a.same_document(h, row0 + r_lo, col)
                               ? exp2f(s[n][e] * c - lse_lo)
                               : 0.f;
        const float p_hi = col < vis_hi && a.same_document(h, row0 + r_lo + 8, col)
                               ? exp2f(s[n][2 + e] * c - lse_hi)
                               : 0.f;
        s[n][e] = p_lo * (dp[n][e] - del_lo);
        s[n][2 + e] = p_hi * (dp[n][2 + e] - del_hi);
      }
    times_tile<DP>(acc, s, ks);
  }
  store_rows<DP>(dq + a.q_at(h) + row0 * a.ldq, a.ldq, acc, r_lo, rows, a.d, a.scale, a.scale);
}

// dK and dV of key tile x / bh of head x % bh over the query tiles that see
// it: dV = P^T dO, dK = scale dS^T Q, computed transposed (S^T = K Q^T, dP^T = V dO^T) so
// that this block's keys are the fragments' rows (the first key tiles, which a causal mask
// shows to most queries, start first). Shared: the K and V tiles, one Q and one dO tile, and
// the tile's lse and delta.
template <int DP>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const AttentionPlan a, const float* __restrict__ q, const float* __restrict__ k,
                const float* __restrict__ v, const float* __restrict__ go,
                const float* __restrict__ lse, const float* __restrict__ delta,
                float* __restrict__ dk, float* __restrict__ dv, bool vec) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* vs = ks + kTile * kLd<DP>;
  __nv_bfloat16* qs = vs + kTile * kLd<DP>;
  __nv_bfloat16* gs = qs + kTile * kLd<DP>;
  auto* lse_s = reinterpret_cast<float*>(gs + kTile * kLd<DP>);
  float* del_s = lse_s + kTile;
  const std::int64_t h = blockIdx.x % a.bh;
  const std::int64_t key0 = std::int64_t(blockIdx.x / a.bh) * kRows;
  const std::int64_t n_keys = min64(kRows, a.s - key0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  load_tile<DP>(ks, k + a.kv_at(h) + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
  load_tile<DP>(vs, v + a.kv_at(h) + key0 * a.ldkv, a.ldkv, n_keys, a.d, vec);
  const float* qh = q + a.q_at(h);
  const float* gh = go + a.o_at(h);

  // Query row i sees key j when j < visible(i), i.e. i >= first_row(j).
  const int r_lo = warp * 16 + g;  // this lane's keys: key0 + r_lo and key0 + r_lo + 8
  const std::int64_t first_lo = a.first_row(key0 + r_lo);
  const std::int64_t first_hi = a.first_row(key0 + r_lo + 8);
  const std::int64_t first_row = a.first_row(key0);
  const float c = a.scale * kLog2e;
  float acc_k[DP / 8][4] = {}, acc_v[DP / 8][4] = {};
  for (std::int64_t q0 = first_row; q0 < a.t; q0 += kTile) {
    __syncthreads();
    const std::int64_t n_rows = min64(kTile, a.t - q0);
    load_tile<DP>(qs, qh + q0 * a.ldq, a.ldq, n_rows, a.d, vec);
    load_tile<DP>(gs, gh + q0 * a.ldo, a.ldo, n_rows, a.d, vec);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      // Rows past T, and rows that see no key (lse -inf), are masked below.
      const bool seen = i < n_rows && a.visible(q0 + i) > 0;
      lse_s[i] = seen ? lse[h * a.t + q0 + i] * kLog2e : 0.f;
      del_s[i] = seen ? delta[h * a.t + q0 + i] : 0.f;
    }
    __syncthreads();
    float st[8][4], dpt[8][4];
    scores<DP>(st, ks, warp * 16, qs);
    scores<DP>(dpt, vs, warp * 16, gs);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = n * 8 + 2 * t + e;  // the query row in this tile
        const std::int64_t row = q0 + i;
        const bool in = row < a.t;
        // Rows past T and keys past S (a partial tile's, never stored) read no document id.
        const bool seen_lo = in && row >= first_lo &&
                             (key0 + r_lo >= a.s || a.same_document(h, row, key0 + r_lo));
        const bool seen_hi = in && row >= first_hi &&
                             (key0 + r_lo + 8 >= a.s || a.same_document(h, row, key0 + r_lo + 8));
        const float p_lo = seen_lo ? exp2f(st[n][e] * c - lse_s[i]) : 0.f;
        const float p_hi = seen_hi ? exp2f(st[n][2 + e] * c - lse_s[i]) : 0.f;
        st[n][e] = p_lo;
        st[n][2 + e] = p_hi;
        dpt[n][e] = p_lo * (dpt[n][e] - del_s[i]);
        dpt[n][2 + e] = p_hi * (dpt[n][2 + e] - del_s[i]);
      }
    times_tile<DP>(acc_v, st, gs);
    times_tile<DP>(acc_k, dpt, qs);
  }
  const std::int64_t at = a.kv_at(h) + key0 * a.ldkv;
  store_rows<DP>(dk + at, a.ldkv, acc_k, r_lo, n_keys, a.d, a.scale, a.scale);
  store_rows<DP>(dv + at, a.ldkv, acc_v, r_lo, n_keys, a.d, 1.f, 1.f);
}

// ------------------------------------------------------------------ launchers

// The head size padded to a multiple of 16 the kernels are built for (0: none).
int padded_d(std::int64_t d) {
  return d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 0;
}

// A grid of one block per kRows rows of n, per head.
unsigned row_blocks(const AttentionPlan& a, std::int64_t n, const char* op) {
  return tile_blocks(a, (n + kRows - 1) / kRows, op);
}

template <int DP>
void forward_d(const AttentionPlan& a, const float* q, const float* k, const float* v, float* o,
               float* lse, bool vec, cudaStream_t st) {
  const std::size_t smem = smem_bytes<DP>(3);
  allow_smem(forward_kernel<DP>, smem, "attention");
  forward_kernel<DP><<<row_blocks(a, a.t, "attention"), kThreads, smem, st>>>(a, q, k, v, o,
                                                                              lse, vec);
  DISTJAX_CUDA_LAUNCHED("attention");
}

template <int DP>
void backward_d(const AttentionPlan& a, const float* q, const float* k, const float* v,
                const float* lse, const float* go, const float* delta, float* dq, float* dk,
                float* dv, bool vec, cudaStream_t st) {
  const std::size_t smem = smem_bytes<DP>(4);
  if (a.t > 0) {
    allow_smem(dq_kernel<DP>, smem, "attention_backward");
    dq_kernel<DP><<<row_blocks(a, a.t, "attention_backward"), kThreads, smem, st>>>(
        a, q, k, v, go, lse, delta, dq, vec);
    DISTJAX_CUDA_LAUNCHED("attention_backward");
  }
  if (a.s > 0) {  // with T == 0 too: dK and dV are then 0
    const std::size_t bytes = smem + 2 * kTile * sizeof(float);
    allow_smem(dkdv_kernel<DP>, bytes, "attention_backward");
    dkdv_kernel<DP><<<row_blocks(a, a.s, "attention_backward"), kThreads, bytes, st>>>(
        a, q, k, v, go, lse, delta, dk, dv, vec);
    DISTJAX_CUDA_LAUNCHED("attention_backward");
  }
}

// Whether the current GPU has bf16 tensor cores, asked once per process.
bool has_bf16_mma() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 8;
  }();
  return yes;
}

bool f32_forced() {
  static const bool yes = [] {
    const char* e = std::getenv("DISTJAX_CUDA_ATTENTION");
    return e && std::strcmp(e, "f32") == 0;
  }();
  return yes;
}

}  // namespace

bool serves(const AttentionPlan& a) {
  return a.bf16_products && padded_d(a.d) != 0 && !f32_forced() && has_bf16_mma();
}

void forward(const AttentionPlan& a, const float* q, const float* k, const float* v, float* o,
             float* lse, bool vec, cudaStream_t st) {
  if (a.bh == 0 || a.t == 0) return;
  switch (padded_d(a.d)) {
    case 32:
      return forward_d<32>(a, q, k, v, o, lse, vec, st);
    case 64:
      return forward_d<64>(a, q, k, v, o, lse, vec, st);
    default:
      return forward_d<128>(a, q, k, v, o, lse, vec, st);
  }
}

void backward(const AttentionPlan& a, const float* q, const float* k, const float* v,
              const float* lse, const float* go, const float* delta, float* dq, float* dk,
              float* dv, bool vec, cudaStream_t st) {
  if (a.bh == 0 || a.d == 0 || (a.t == 0 && a.s == 0)) return;
  switch (padded_d(a.d)) {
    case 32:
      return backward_d<32>(a, q, k, v, lse, go, delta, dq, dk, dv, vec, st);
    case 64:
      return backward_d<64>(a, q, k, v, lse, go, delta, dq, dk, dv, vec, st);
    default:
      return backward_d<128>(a, q, k, v, lse, go, delta, dq, dk, dv, vec, st);
  }
}

}  // namespace distjax::tensor::cuda::attn_mma
