// Register-blocked small GEMM (see small_gemm.hpp): micro-tiles of up to 6 rows x 64
// columns (24 accumulators), B rows loaded as vectors (masked at the right edge), A
// elements broadcast, so any layout of A costs the same.
#include "distjax/tensor/cpu/small_gemm.hpp"

#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace distjax::tensor::detail::cpu {

namespace {

#if defined(__AVX512F__)
constexpr int kMr = 6;   // rows per micro-tile
constexpr int kNv = 4;   // 16-float vectors per micro-tile row
constexpr std::int64_t kNc = 16 * kNv;

template <int MR, int NV>
void micro(std::int64_t k, float alpha, const float* a, std::int64_t a_rs, std::int64_t a_cs,
           const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
           __mmask16 last) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
    const float* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? last : __mmask16(0xFFFF);
      __m512 out = _mm512_mul_ps(al, acc[r][v]);
      if (beta != 0.f) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mk, cr + 16 * v));
      _mm512_mask_storeu_ps(cr + 16 * v, mk, out);
    }
  }
}

using MicroFn = void (*)(std::int64_t, float, const float*, std::int64_t, std::int64_t,
                         const float*, std::int64_t, float, float*, std::int64_t, __mmask16);

template <int MR>
MicroFn pick_nv(int nv) {
  switch (nv) {
    case 1:
      return micro<MR, 1>;
    case 2:
      return micro<MR, 2>;
    case 3:
      return micro<MR, 3>;
    default:
      return micro<MR, 4>;
  }
}

MicroFn pick(int mr, int nv) {
  switch (mr) {
    case 1:
      return pick_nv<1>(nv);
    case 2:
      return pick_nv<2>(nv);
    case 3:
      return pick_nv<3>(nv);
    case 4:
      return pick_nv<4>(nv);
    case 5:
      return pick_nv<5>(nv);
    default:
      return pick_nv<6>(nv);
  }
}
#endif

}  // namespace

void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                std::int64_t a_rs, std::int64_t a_cs, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
#if defined(__AVX512F__)
  for (std::int64_t j0 = 0; j0 < n; j0 += kNc) {
    const std::int64_t w = std::min(kNc, n - j0);
    const int nv = static_cast<int>((w + 15) / 16);
    const int tail = static_cast<int>(w - 16 * (nv - 1));
    const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1u);
    const MicroFn full = pick(kMr, nv);
    std::int64_t i0 = 0;
    for (; i0 + kMr <= m; i0 += kMr)
      full(k, alpha, a + i0 * a_rs, a_rs, a_cs, b + j0, ldb, beta, c + i0 * ldc + j0, ldc, last);
    if (i0 < m)
      pick(static_cast<int>(m - i0), nv)(k, alpha, a + i0 * a_rs, a_rs, a_cs, b + j0, ldb, beta,
                                         c + i0 * ldc + j0, ldc, last);
  }
#else
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (std::int64_t p = 0; p < k; ++p)
        acc += a[i * a_rs + p * a_cs] * b[p * ldb + j];
      c[i * ldc + j] = alpha * acc + (beta != 0.f ? c[i * ldc + j] : 0.f);
    }
#endif
}

#if defined(__AVX512F__)
// g++ 12 flags the unmasked unpack/shuffle intrinsics' internal _mm512_undefined_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a g++ warning that clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace {
// dst (16 x 16, ldd) = src (16 x 16, lds)^T in registers: 32-bit, 64-bit and two 128-bit
// lane interleaves.
void transpose16(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 2]);
    const __m512d c = _mm512_castps_pd(t[i + 1]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  // r[4q + c] holds column c (of 4) of rows 4q..4q+3, in each 128-bit lane L the
  // entries of columns 4L + c.
  for (int i = 0; i < 16; i += 8)
    for (int c = 0; c < 4; ++c) {
      t[i + c] = _mm512_shuffle_f32x4(r[i + c], r[i + 4 + c], 0x88);
      t[i + 4 + c] = _mm512_shuffle_f32x4(r[i + c], r[i + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
  for (int i = 0; i < 16; ++i)
    _mm512_storeu_ps(dst + i * ldd, r[i]);
}
}  // namespace
#pragma GCC diagnostic pop
#endif

void transpose(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t lds,
               float* dst, std::int64_t ldd) {
  constexpr std::int64_t kB = 16;
  for (std::int64_t i0 = 0; i0 < rows; i0 += kB)
    for (std::int64_t j0 = 0; j0 < cols; j0 += kB) {
      const std::int64_t ie = std::min(rows, i0 + kB), je = std::min(cols, j0 + kB);
#if defined(__AVX512F__)
      if (ie - i0 == kB && je - j0 == kB) {
        transpose16(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
        continue;
      }
#endif
      for (std::int64_t j = j0; j < je; ++j)
        for (std::int64_t i = i0; i < ie; ++i)
          dst[j * ldd + i] = src[i * lds + j];
    }
}

}  // namespace distjax::tensor::detail::cpu
