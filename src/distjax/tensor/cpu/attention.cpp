// CPU kernels: fused multi-head attention (see tensor/attention.hpp). Per head, scores =
// scale * Q K^T, mask, softmax, times V. Only a block of kRowBlock score rows exists at a
// time, and for a causal mask each block's GEMMs stop at the last key its rows can see,
// which skips most of the masked upper triangle. Document ids (AttentionPlan::segments)
// mask the scores of keys in other documents to -inf, and a block's GEMMs start at the
// first key any of its rows sees (skipping the earlier documents of a packed sequence).
// The forward saves the row log-sum-exp; the backward recomputes the probabilities from it
// (FlashAttention's recipe, at the granularity of a row block).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/cpu/small_gemm.hpp"
#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Score rows per block: small enough for the block (kRowBlock x S) to stay in L2 and for
// the causal skip to be fine-grained (the blocks compute 5/8 of a T = 128 score matrix,
// the masked triangle itself is 1/2), large enough to amortise the dK, dV updates.
constexpr std::int64_t kRowBlock = 32;

// Sets the entries [j0, n) of query i's score row whose key lies in another document to
// `masked`; nothing without ids (the head's row of document ids, T == S).
void mask_documents(const std::int32_t* ids, std::int64_t i, float* row, std::int64_t j0,
                    std::int64_t n, float masked) {
  if (ids == nullptr) return;
  const std::int32_t own = ids[i];
  for (std::int64_t j = j0; j < n; ++j)
    if (ids[j] != own) row[j] = masked;
}

// The first key below kmax that a row of the block [t0, t0 + rows) sees by its document
// (0 without ids): the block's products start there, the keys before it being all masked
// (earlier documents of a packed sequence). Each row sees its own key, so it is <= t0.
std::int64_t first_key(const std::int32_t* ids, std::int64_t t0, std::int64_t rows,
                       std::int64_t kmax) {
  if (ids == nullptr) return 0;
  for (std::int64_t j = 0; j < kmax; ++j)
    for (std::int64_t i = t0; i < t0 + rows; ++i)
      if (ids[i] == ids[j]) return j;
  return kmax;
}

// The head's row of document ids, or null.
const std::int32_t* document_ids(const AttentionPlan& a, std::int64_t h) {
  return a.segments == nullptr ? nullptr : a.segments + h / a.segment_heads * a.t;
}

// One head's forward: Q (T, D), K and V (S, D) -> O (T, D), L (T), rows at the strides
// of `a`; ids: its document ids or null. p: kRowBlock * S scratch; kt: D * S scratch (K
// transposed).
void head_forward(const AttentionPlan& a, const std::int32_t* ids, const float* q, const float* k,
                  const float* v, float* o, float* l, float* p, float* kt) {
  const std::int64_t s = a.s, d = a.d;
  transpose(k, s, d, a.ldkv, kt, s);
  for (std::int64_t t0 = 0; t0 < a.t; t0 += kRowBlock) {
    const std::int64_t rows = std::min(kRowBlock, a.t - t0);
    const std::int64_t kmax = a.visible(t0 + rows - 1);
    if (kmax == 0) {  // no key visible to any row: output 0 (and no gradient)
      for (std::int64_t i = t0; i < t0 + rows; ++i)
        std::fill(o + i * a.ldo, o + i * a.ldo + d, 0.f);
      std::fill(l + t0, l + t0 + rows, -INFINITY);
      continue;
    }
    // Keys [k0, kmax): with document ids, k0 skips the earlier documents no row sees.
    const std::int64_t k0 = first_key(ids, t0, rows, kmax);
    small_gemm(rows, kmax - k0, d, a.scale, q + t0 * a.ldq, a.ldq, 1, kt + k0, s, 0.f, p + k0, s);
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = p + i * s + k0;                    // keys from k0 on
      const std::int64_t n = a.visible(t0 + i) - k0;  // > 0 with ids: the row sees itself
      if (n <= 0) {
        std::fill(row, row + (kmax - k0), 0.f);
        l[t0 + i] = -INFINITY;
        continue;
      }
      std::fill(row + n, row + (kmax - k0), 0.f);
      mask_documents(ids == nullptr ? nullptr : ids + k0, t0 + i - k0, row, 0, n, -INFINITY);
      const float m = row_max(row, n);
      const float sum = exp_shifted_sum(row, row, n, m);
      const float inv = 1.f / sum;
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j)
        row[j] *= inv;
      l[t0 + i] = m + std::log(sum);
    }
    small_gemm(rows, d, kmax - k0, 1.f, p + k0, s, 1, v + k0 * a.ldkv, a.ldkv, 0.f, o + t0 * a.ldo,
               a.ldo);
  }
}

// One head's backward. dq (T, D), dk and dv (S, D) are written (rows at the strides of
// q, k and v). p, dp: kRowBlock * S scratch each; di: T scratch; kt, vt: D * S scratch
// each (K and V transposed).
void head_backward(const AttentionPlan& a, const std::int32_t* ids, const float* q, const float* k,
                   const float* v, const float* o, const float* l, const float* go, float* dq,
                   float* dk, float* dv, float* p, float* dp, float* di, float* kt, float* vt) {
  const std::int64_t s = a.s, d = a.d;
  transpose(k, s, d, a.ldkv, kt, s);
  transpose(v, s, d, a.ldkv, vt, s);
  for (std::int64_t t = 0; t < a.t; ++t) {  // D_t = <dO_t, O_t> = sum_j P_tj dP_tj
    const float* gr = go + t * a.ldo;
    const float* orow = o + t * a.ldo;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (std::int64_t j = 0; j < d; ++j)
      acc += gr[j] * orow[j];
    di[t] = acc;
  }
  for (std::int64_t j = 0; j < s; ++j) {
    std::fill(dk + j * a.ldkv, dk + j * a.ldkv + d, 0.f);
    std::fill(dv + j * a.ldkv, dv + j * a.ldkv + d, 0.f);
  }
  for (std::int64_t t0 = 0; t0 < a.t; t0 += kRowBlock) {
    const std::int64_t rows = std::min(kRowBlock, a.t - t0);
    const std::int64_t kmax = a.visible(t0 + rows - 1);
    if (kmax == 0) {
      for (std::int64_t i = t0; i < t0 + rows; ++i)
        std::fill(dq + i * a.ldq, dq + i * a.ldq + d, 0.f);
      continue;
    }
    const float* qb = q + t0 * a.ldq;
    const float* gb = go + t0 * a.ldo;
    // Keys [k0, kmax), as in the forward (k0 = 0 without document ids).
    const std::int64_t k0 = first_key(ids, t0, rows, kmax), nk = kmax - k0;
    // P = exp(scale * Q K^T - L), recomputed from the saved log-sum-exp.
    small_gemm(rows, nk, d, a.scale, qb, a.ldq, 1, kt + k0, s, 0.f, p + k0, s);
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = p + i * s + k0;
      const std::int64_t n = std::max<std::int64_t>(a.visible(t0 + i) - k0, 0);
      const float li = l[t0 + i];
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j)
        row[j] = fast_exp(row[j] - li);
      std::fill(row + n, row + nk, 0.f);
      // Other documents: P = 0, so dS = 0.
      mask_documents(ids == nullptr ? nullptr : ids + k0, t0 + i - k0, row, 0, n, 0.f);
    }
    // dV += P^T dO;  dP = dO V^T
    small_gemm(nk, d, rows, 1.f, p + k0, 1, s, gb, a.ldo, 1.f, dv + k0 * a.ldkv, a.ldkv);
    small_gemm(rows, nk, d, 1.f, gb, a.ldo, 1, vt + k0, s, 0.f, dp + k0, s);
    // dS = P * (dP - D_t); the softmax Jacobian, row by row.
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* pr = p + i * s + k0;
      float* dr = dp + i * s + k0;
      const float dt = di[t0 + i];
#pragma omp simd
      for (std::int64_t j = 0; j < nk; ++j)
        dr[j] = pr[j] * (dr[j] - dt);
    }
    // dQ = scale * dS K;  dK += scale * dS^T Q
    small_gemm(rows, d, nk, a.scale, dp + k0, s, 1, k + k0 * a.ldkv, a.ldkv, 0.f, dq + t0 * a.ldq,
               a.ldq);
    small_gemm(nk, d, rows, a.scale, dp + k0, 1, s, qb, a.ldq, 1.f, dk + k0 * a.ldkv, a.ldkv);
  }
}

// Heads run in parallel when the whole problem is big enough; handed out dynamically so a
// thread that loses its core to another process does not hold up the rest.
int attention_threads(const AttentionPlan& a) {
  return a.bh > 1 && a.bh * a.t * a.s * a.d > kParallelGrain ? omp_get_max_threads() : 1;
}

void forward(const AttentionPlan& a, const float* pq, const float* pk, const float* pv, float* po,
             float* pl) {
#pragma omp parallel num_threads(attention_threads(a))
  {
    std::vector<float> scratch(static_cast<std::size_t>(kRowBlock * a.s + a.d * a.s));
    float* kt = scratch.data() + kRowBlock * a.s;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t h = 0; h < a.bh; ++h)
      head_forward(a, document_ids(a, h), pq + a.q_at(h), pk + a.kv_at(h), pv + a.kv_at(h),
                   po + a.o_at(h), pl + h * a.t, scratch.data(), kt);
  }
}

void backward(const AttentionPlan& a, const float* pq, const float* pk, const float* pv,
              const float* po, const float* pl, const float* pg, float* gq, float* gk, float* gv) {
#pragma omp parallel num_threads(attention_threads(a))
  {
    std::vector<float> scratch(static_cast<std::size_t>(2 * kRowBlock * a.s + a.t + 2 * a.d * a.s));
    float* p = scratch.data();
    float* dp = p + kRowBlock * a.s;
    float* di = dp + kRowBlock * a.s;
    float* kt = di + a.t;
    float* vt = kt + a.d * a.s;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t h = 0; h < a.bh; ++h) {
      const std::int64_t qo = a.q_at(h), ko = a.kv_at(h), oo = a.o_at(h);
      head_backward(a, document_ids(a, h), pq + qo, pk + ko, pv + ko, po + oo, pl + h * a.t,
                    pg + oo, gq + qo, gk + ko, gv + ko, p, dp, di, kt, vt);
    }
  }
}

// The online-softmax merge of a block's rows into the running ones (see AttentionKernels).
void merge(std::int64_t rows, std::int64_t d, float* o, float* lse, const float* ob,
           const float* lseb) {
#pragma omp parallel for num_threads(rows * d > kParallelGrain ? omp_get_max_threads() : 1)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float l1 = lse[r], l2 = lseb[r];
    if (l2 == -INFINITY) continue;  // the block saw nothing for this row
    float* orow = o + r * d;
    const float* brow = ob + r * d;
    if (l1 == -INFINITY) {
      std::copy(brow, brow + d, orow);
      lse[r] = l2;
      continue;
    }
    const float m = std::max(l1, l2);
    const float l = m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
    const float w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
#pragma omp simd
    for (std::int64_t c = 0; c < d; ++c)
      orow[c] = w1 * orow[c] + w2 * brow[c];
    lse[r] = l;
  }
}

// ------------------------------------------------------------------ bf16 operands
// The table's bf16 entries: operands widened to f32 in the (bh, T, D) layout, the kernels
// above, outputs rounded to bf16 at the plan's layout. The CPU's bf16 policy runs the f32
// entries (no copies, no rounding of o); these serve the tests of the op's bf16 path,
// which turn them on with set_serves_bf16_attention.

std::atomic<bool> g_serves_bf16{false};

// The plan of the same problem with every operand in the (bh, T or S, D) layout.
AttentionPlan contiguous(const AttentionPlan& a) {
  AttentionPlan c = a;
  c.ldq = c.ldkv = c.ldo = a.d;
  c.heads = 1;
  c.q_b = c.o_b = a.t * a.d;
  c.kv_b = a.s * a.d;
  c.q_h = c.kv_h = c.o_h = 0;
  return c;
}

// The rows (n per head, `ld` apart, head h at at(h)) of operand x, widened, head after head.
template <class At>
std::vector<float> widen(const AttentionPlan& a, const bf16* x, std::int64_t n, std::int64_t ld,
                         At at) {
  std::vector<float> out(static_cast<std::size_t>(a.bh * n * a.d));
  for (std::int64_t h = 0; h < a.bh; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < a.d; ++c)
        out[static_cast<std::size_t>((h * n + i) * a.d + c)] =
            static_cast<float>(x[at(h) + i * ld + c]);
  return out;
}

// The inverse: rows of `src` (head after head) rounded into operand x.
template <class At>
void narrow(const AttentionPlan& a, const std::vector<float>& src, bf16* x, std::int64_t n,
            std::int64_t ld, At at) {
  for (std::int64_t h = 0; h < a.bh; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < a.d; ++c)
        x[at(h) + i * ld + c] = bf16(src[static_cast<std::size_t>((h * n + i) * a.d + c)]);
}

bool serves_bf16(const AttentionPlan& a) {
  return a.bf16_products && g_serves_bf16.load(std::memory_order_relaxed);
}

void forward_bf16(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                  float* lse) {
  auto qa = [&](std::int64_t h) { return a.q_at(h); };
  auto kva = [&](std::int64_t h) { return a.kv_at(h); };
  const std::vector<float> q32 = widen(a, q, a.t, a.ldq, qa), k32 = widen(a, k, a.s, a.ldkv, kva),
                           v32 = widen(a, v, a.s, a.ldkv, kva);
  std::vector<float> o32(static_cast<std::size_t>(a.bh * a.t * a.d));
  forward(contiguous(a), q32.data(), k32.data(), v32.data(), o32.data(), lse);
  narrow(a, o32, o, a.t, a.ldo, [&](std::int64_t h) { return a.o_at(h); });
}

void backward_bf16(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v,
                   const bf16* o, const float* lse, const bf16* go, bf16* dq, bf16* dk, bf16* dv) {
  auto qa = [&](std::int64_t h) { return a.q_at(h); };
  auto kva = [&](std::int64_t h) { return a.kv_at(h); };
  auto oa = [&](std::int64_t h) { return a.o_at(h); };
  const std::vector<float> q32 = widen(a, q, a.t, a.ldq, qa), k32 = widen(a, k, a.s, a.ldkv, kva),
                           v32 = widen(a, v, a.s, a.ldkv, kva), o32 = widen(a, o, a.t, a.ldo, oa),
                           g32 = widen(a, go, a.t, a.ldo, oa);
  std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
  backward(contiguous(a), q32.data(), k32.data(), v32.data(), o32.data(), lse, g32.data(),
           dq32.data(), dk32.data(), dv32.data());
  narrow(a, dq32, dq, a.t, a.ldq, qa);
  narrow(a, dk32, dk, a.s, a.ldkv, kva);
  narrow(a, dv32, dv, a.s, a.ldkv, kva);
}

}  // namespace

void set_serves_bf16_attention(bool on) { g_serves_bf16.store(on, std::memory_order_relaxed); }

const AttentionKernels attention_kernels{
    .forward = forward,
    .backward = backward,
    .merge = merge,
    .serves_bf16 = serves_bf16,
    .forward_bf16 = forward_bf16,
    .backward_bf16 = backward_bf16,
};

}  // namespace distjax::tensor::detail::cpu
