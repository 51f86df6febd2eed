// Fused multi-head attention: per (b, h), scores = scale * Q K^T, mask, softmax, times V.
// Only a block of kRowBlock score rows exists at a time, and for a causal mask each
// block's GEMMs stop at the last key its rows can see, which skips most of the masked
// upper triangle. The forward saves the row log-sum-exp; the backward recomputes the
// probabilities from it (FlashAttention's recipe, at the granularity of a row block).
#include "distjax/tensor/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/detail/small_gemm.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::tensor {
namespace {

using detail::small_gemm;

// Score rows per block: small enough for the block (kRowBlock x S) to stay in L2 and for
// the causal skip to be fine-grained (the blocks compute 5/8 of a T = 128 score matrix,
// the masked triangle itself is 1/2), large enough to amortise the dK, dV updates.
constexpr std::int64_t kRowBlock = 32;

struct AttnDims {
  std::int64_t bh, t, s, d;
  // Row strides (elements) of q (and dq), k and v (and dk, dv), o (and dO): d for the
  // (B, H, T, D) layout; 3 H D and H D for the packed (B, T, H, 3, D) / (B, T, H, D) one.
  std::int64_t ldq, ldkv, ldo;
  bool causal;
  float scale;
  // Keys visible to query row `row` (all of them without a mask).
  std::int64_t visible(std::int64_t row) const {
    return causal ? std::clamp<std::int64_t>(row + 1 + (s - t), 0, s) : s;
  }
};

// One head's forward: Q (T, D), K and V (S, D) -> O (T, D), L (T), rows at the strides
// of `a`. p: kRowBlock * S scratch; kt: D * S scratch (K transposed).
void head_forward(const AttnDims& a, const float* q, const float* k, const float* v, float* o,
                  float* l, float* p, float* kt) {
  const std::int64_t s = a.s, d = a.d;
  detail::transpose(k, s, d, a.ldkv, kt, s);
  for (std::int64_t t0 = 0; t0 < a.t; t0 += kRowBlock) {
    const std::int64_t rows = std::min(kRowBlock, a.t - t0);
    const std::int64_t kmax = a.visible(t0 + rows - 1);
    if (kmax == 0) {  // no key visible to any row: output 0 (and no gradient)
      for (std::int64_t i = t0; i < t0 + rows; ++i)
        std::fill(o + i * a.ldo, o + i * a.ldo + d, 0.f);
      std::fill(l + t0, l + t0 + rows, -INFINITY);
      continue;
    }
    small_gemm(rows, kmax, d, a.scale, q + t0 * a.ldq, a.ldq, 1, kt, s, 0.f, p, s);
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = p + i * s;
      const std::int64_t n = a.visible(t0 + i);
      std::fill(row + n, row + kmax, 0.f);
      if (n == 0) {
        l[t0 + i] = -INFINITY;
        continue;
      }
      const float m = detail::row_max(row, n);
      const float sum = detail::exp_shifted_sum(row, row, n, m);
      const float inv = 1.f / sum;
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j)
        row[j] *= inv;
      l[t0 + i] = m + std::log(sum);
    }
    small_gemm(rows, d, kmax, 1.f, p, s, 1, v, a.ldkv, 0.f, o + t0 * a.ldo, a.ldo);
  }
}

// One head's backward. dq (T, D), dk and dv (S, D) are written (rows at the strides of
// q, k and v). p, dp: kRowBlock * S scratch each; di: T scratch; kt, vt: D * S scratch
// each (K and V transposed).
void head_backward(const AttnDims& a, const float* q, const float* k, const float* v,
                   const float* o, const float* l, const float* go, float* dq, float* dk, float* dv,
                   float* p, float* dp, float* di, float* kt, float* vt) {
  const std::int64_t s = a.s, d = a.d;
  detail::transpose(k, s, d, a.ldkv, kt, s);
  detail::transpose(v, s, d, a.ldkv, vt, s);
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
    // P = exp(scale * Q K^T - L), recomputed from the saved log-sum-exp.
    small_gemm(rows, kmax, d, a.scale, qb, a.ldq, 1, kt, s, 0.f, p, s);
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = p + i * s;
      const std::int64_t n = a.visible(t0 + i);
      const float li = l[t0 + i];
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j)
        row[j] = detail::fast_exp(row[j] - li);
      std::fill(row + n, row + kmax, 0.f);
    }
    // dV += P^T dO;  dP = dO V^T
    small_gemm(kmax, d, rows, 1.f, p, 1, s, gb, a.ldo, 1.f, dv, a.ldkv);
    small_gemm(rows, kmax, d, 1.f, gb, a.ldo, 1, vt, s, 0.f, dp, s);
    // dS = P * (dP - D_t); the softmax Jacobian, row by row.
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* pr = p + i * s;
      float* dr = dp + i * s;
      const float dt = di[t0 + i];
#pragma omp simd
      for (std::int64_t j = 0; j < kmax; ++j)
        dr[j] = pr[j] * (dr[j] - dt);
    }
    // dQ = scale * dS K;  dK += scale * dS^T Q
    small_gemm(rows, d, kmax, a.scale, dp, s, 1, k, a.ldkv, 0.f, dq + t0 * a.ldq, a.ldq);
    small_gemm(kmax, d, rows, a.scale, dp, 1, s, qb, a.ldq, 1.f, dk, a.ldkv);
  }
}

AttnDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale) {
  detail::require_f32("attention", {&q, &k, &v});
  DISTJAX_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, InvalidArgument,
                "[attention] expected q (B, H, T, D), k and v (B, H, S, D), got q ",
                to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()));
  DISTJAX_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                    q.size(3) == k.size(3),
                InvalidArgument, "[attention] shapes do not match: q ", to_string(q.shape()),
                ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
                " (expected q (B, H, T, D), k and v (B, H, S, D))");
  AttnDims a;
  a.bh = q.size(0) * q.size(1);
  a.t = q.size(2);
  a.s = k.size(2);
  a.d = q.size(3);
  a.ldq = a.ldkv = a.ldo = a.d;
  a.causal = causal;
  a.scale =
      scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(std::max<std::int64_t>(a.d, 1)));
  return a;
}

// Heads run in parallel when the whole problem is big enough; handed out dynamically so a
// thread that loses its core to another process does not hold up the rest.
int attention_threads(const AttnDims& a) {
  return a.bh > 1 && a.bh * a.t * a.s * a.d > detail::kParallelGrain ? omp_get_max_threads() : 1;
}

// Where head h = b * heads + j of the (B*H) heads starts in each operand (elements).
struct Layout {
  std::int64_t heads;
  std::int64_t q_b, q_h, kv_b, kv_h, o_b, o_h;
  std::int64_t q(std::int64_t h) const { return h / heads * q_b + h % heads * q_h; }
  std::int64_t kv(std::int64_t h) const { return h / heads * kv_b + h % heads * kv_h; }
  std::int64_t o(std::int64_t h) const { return h / heads * o_b + h % heads * o_h; }
};

// The (B, H, T, D) layout of q and o, (B, H, S, D) of k and v.
Layout head_major(const AttnDims& a) { return {1, a.t * a.d, 0, a.s * a.d, 0, a.t * a.d, 0}; }

void run_forward(const AttnDims& a, const Layout& lay, const float* pq, const float* pk,
                 const float* pv, float* po, float* pl) {
#pragma omp parallel num_threads(attention_threads(a))
  {
    std::vector<float> scratch(static_cast<std::size_t>(kRowBlock * a.s + a.d * a.s));
    float* kt = scratch.data() + kRowBlock * a.s;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t h = 0; h < a.bh; ++h)
      head_forward(a, pq + lay.q(h), pk + lay.kv(h), pv + lay.kv(h), po + lay.o(h), pl + h * a.t,
                   scratch.data(), kt);
  }
}

void run_backward(const AttnDims& a, const Layout& lay, const float* pq, const float* pk,
                  const float* pv, const float* po, const float* pl, const float* pg, float* gq,
                  float* gk, float* gv) {
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
      const std::int64_t qo = lay.q(h), ko = lay.kv(h), oo = lay.o(h);
      head_backward(a, pq + qo, pk + ko, pv + ko, po + oo, pl + h * a.t, pg + oo, gq + qo, gk + ko,
                    gv + ko, p, dp, di, kt, vt);
    }
  }
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  const AttnDims a = check_attention(q, k, v, causal, scale);
  Tensor out = Tensor::empty(q.shape());
  Tensor lse = Tensor::empty({q.size(0), q.size(1), a.t});
  run_forward(a, head_major(a), q.data<float>(), k.data<float>(), v.data<float>(),
              out.data<float>(), lse.data<float>());
  if (!needs_grad({&q, &k, &v})) return joined(out, {&q, &k, &v});
  return record("attention", {q, k, v}, out,
                [a, qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach(),
                 lse](const std::vector<Tensor>& g) {
                  Tensor gq = Tensor::empty(qd.shape()), gk = Tensor::empty(kd.shape()),
                         gv = Tensor::empty(vd.shape());
                  run_backward(a, head_major(a), qd.data<float>(), kd.data<float>(),
                               vd.data<float>(), od.data<float>(), lse.data<float>(),
                               g[0].data<float>(), gq.data<float>(), gk.data<float>(),
                               gv.data<float>());
                  return std::vector<Tensor>{gq, gk, gv};
                });
}

Tensor attention_packed(const Tensor& qkv, std::int64_t num_heads, bool causal, float scale) {
  detail::require_f32("attention_packed", {&qkv});
  DISTJAX_CHECK(qkv.rank() == 3 && num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0,
                InvalidArgument, "[attention_packed] expected qkv (B, T, 3 H D) with H = ",
                num_heads, " heads, got ", to_string(qkv.shape()));
  const std::int64_t b = qkv.size(0), t = qkv.size(1), h = num_heads;
  const std::int64_t d = qkv.size(2) / (3 * h), c = h * d;
  AttnDims a;
  a.bh = b * h;
  a.t = a.s = t;
  a.d = d;
  a.ldq = a.ldkv = 3 * c;
  a.ldo = c;
  a.causal = causal;
  a.scale =
      scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(std::max<std::int64_t>(d, 1)));
  // Head j of batch i: q at row (i, 0) + j 3D, k and v D and 2 D further; o at j D.
  const Layout lay{h, t * 3 * c, 3 * d, t * 3 * c, 3 * d, t * c, d};
  Tensor out = Tensor::empty({b, t, c});
  Tensor lse = Tensor::empty({b, h, t});
  const float* pq = qkv.data<float>();
  run_forward(a, lay, pq, pq + d, pq + 2 * d, out.data<float>(), lse.data<float>());
  if (!needs_grad({&qkv})) return joined(out, {&qkv});
  return record("attention_packed", {qkv}, out,
                [a, lay, xd = qkv.detach(), od = out.detach(), lse](const std::vector<Tensor>& g) {
                  Tensor gx = Tensor::empty(xd.shape());
                  const float* px = xd.data<float>();
                  float* pgx = gx.data<float>();
                  run_backward(a, lay, px, px + a.d, px + 2 * a.d, od.data<float>(),
                               lse.data<float>(), g[0].data<float>(), pgx, pgx + a.d,
                               pgx + 2 * a.d);
                  return std::vector<Tensor>{gx};
                });
}

}  // namespace distjax::tensor
