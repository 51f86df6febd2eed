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
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::tensor {
namespace {

using detail::gemm_f32_ld;

// Score rows per block: small enough for the block (kRowBlock x S) to stay in L2, large
// enough that each GEMM call does real work.
constexpr std::int64_t kRowBlock = 32;

struct AttnDims {
  std::int64_t bh, t, s, d;
  bool causal;
  float scale;
  // Keys visible to query row `row` (all of them without a mask).
  std::int64_t visible(std::int64_t row) const {
    return causal ? std::clamp<std::int64_t>(row + 1 + (s - t), 0, s) : s;
  }
};

// One head's forward: Q (T, D), K and V (S, D) -> O (T, D), L (T). p: kRowBlock * S scratch.
void head_forward(const AttnDims& a, const float* q, const float* k, const float* v, float* o,
                  float* l, float* p) {
  const std::int64_t s = a.s, d = a.d;
  for (std::int64_t t0 = 0; t0 < a.t; t0 += kRowBlock) {
    const std::int64_t rows = std::min(kRowBlock, a.t - t0);
    const std::int64_t kmax = a.visible(t0 + rows - 1);
    if (kmax == 0) {  // no key visible to any row: output 0 (and no gradient)
      std::fill(o + t0 * d, o + (t0 + rows) * d, 0.f);
      std::fill(l + t0, l + t0 + rows, -INFINITY);
      continue;
    }
    gemm_f32_ld(false, true, rows, kmax, d, a.scale, q + t0 * d, d, k, d, 0.f, p, s);
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
    gemm_f32_ld(false, false, rows, d, kmax, 1.f, p, s, v, d, 0.f, o + t0 * d, d);
  }
}

// One head's backward. dq (T, D), dk and dv (S, D) are written. p, dp: kRowBlock * S
// scratch each; di: T scratch.
void head_backward(const AttnDims& a, const float* q, const float* k, const float* v,
                   const float* o, const float* l, const float* go, float* dq, float* dk, float* dv,
                   float* p, float* dp, float* di) {
  const std::int64_t s = a.s, d = a.d;
  for (std::int64_t t = 0; t < a.t; ++t) {  // D_t = <dO_t, O_t> = sum_j P_tj dP_tj
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (std::int64_t j = 0; j < d; ++j)
      acc += go[t * d + j] * o[t * d + j];
    di[t] = acc;
  }
  std::fill(dk, dk + s * d, 0.f);
  std::fill(dv, dv + s * d, 0.f);
  for (std::int64_t t0 = 0; t0 < a.t; t0 += kRowBlock) {
    const std::int64_t rows = std::min(kRowBlock, a.t - t0);
    const std::int64_t kmax = a.visible(t0 + rows - 1);
    if (kmax == 0) {
      std::fill(dq + t0 * d, dq + (t0 + rows) * d, 0.f);
      continue;
    }
    // P = exp(scale * Q K^T - L), recomputed from the saved log-sum-exp.
    gemm_f32_ld(false, true, rows, kmax, d, a.scale, q + t0 * d, d, k, d, 0.f, p, s);
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
    gemm_f32_ld(true, false, kmax, d, rows, 1.f, p, s, go + t0 * d, d, 1.f, dv, d);
    gemm_f32_ld(false, true, rows, kmax, d, 1.f, go + t0 * d, d, v, d, 0.f, dp, s);
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
    gemm_f32_ld(false, false, rows, d, kmax, a.scale, dp, s, k, d, 0.f, dq + t0 * d, d);
    gemm_f32_ld(true, false, kmax, d, rows, a.scale, dp, s, q + t0 * d, d, 1.f, dk, d);
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

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  const AttnDims a = check_attention(q, k, v, causal, scale);
  Tensor out = Tensor::empty(q.shape());
  Tensor lse = Tensor::empty({q.size(0), q.size(1), a.t});
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
#pragma omp parallel num_threads(attention_threads(a))
  {
    std::vector<float> scratch(static_cast<std::size_t>(kRowBlock * a.s));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t h = 0; h < a.bh; ++h)
      head_forward(a, pq + h * a.t * a.d, pk + h * a.s * a.d, pv + h * a.s * a.d,
                   po + h * a.t * a.d, pl + h * a.t, scratch.data());
  }
  if (!needs_grad({&q, &k, &v})) return out;
  return record("attention", {q, k, v}, out,
                [a, qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach(),
                 lse](const std::vector<Tensor>& g) {
                  Tensor gq = Tensor::empty(qd.shape()), gk = Tensor::empty(kd.shape()),
                         gv = Tensor::empty(vd.shape());
                  const float* pq = qd.data<float>();
                  const float* pk = kd.data<float>();
                  const float* pv = vd.data<float>();
                  const float* po = od.data<float>();
                  const float* pl = lse.data<float>();
                  const float* pg = g[0].data<float>();
                  float* gqp = gq.data<float>();
                  float* gkp = gk.data<float>();
                  float* gvp = gv.data<float>();
#pragma omp parallel num_threads(attention_threads(a))
                  {
                    std::vector<float> scratch(static_cast<std::size_t>(2 * kRowBlock * a.s + a.t));
                    float* p = scratch.data();
                    float* dp = p + kRowBlock * a.s;
                    float* di = dp + kRowBlock * a.s;
#pragma omp for schedule(dynamic, 1)
                    for (std::int64_t h = 0; h < a.bh; ++h) {
                      const std::int64_t qo = h * a.t * a.d, ko = h * a.s * a.d;
                      head_backward(a, pq + qo, pk + ko, pv + ko, po + qo, pl + h * a.t, pg + qo,
                                    gqp + qo, gkp + ko, gvp + ko, p, dp, di);
                    }
                  }
                  return std::vector<Tensor>{gq, gk, gv};
                });
}

}  // namespace distjax::tensor
