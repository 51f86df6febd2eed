// CPU kernels: the fused NN ops over rows. x (n, c) is handled a row at a time while it
// sits in L1; each kernel's backward follows its forward.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Threads for `work` elements: kParallelGrain when each element costs an exp,
// kParallelGrainMemory when it costs a few flops (see kernels.hpp).
int threads_for(std::int64_t work, std::int64_t grain = kParallelGrain) {
  return work > grain ? omp_get_max_threads() : 1;
}

// Sums per-thread partial rows part[t * len + i] over t into part[0..len).
void reduce_partials(std::vector<float>& part, int nt, std::int64_t len) {
  for (int t = 1; t < nt; ++t) {
    const float* src = part.data() + t * len;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i)
      part[i] += src[i];
  }
}

// Calls f with the ids as the C++ type of id_dtype (i32 or i64).
template <class F>
void with_ids(const void* ids, DType id_dtype, F&& f) {
  if (id_dtype == DType::I32)
    f(static_cast<const std::int32_t*>(ids));
  else
    f(static_cast<const std::int64_t*>(ids));
}

// ------------------------------------------------------------------ softmax

void softmax(const float* px, float* py, std::int64_t n, std::int64_t c, bool log_form) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * c;
    float* yr = py + r * c;
    if (log_form) {
      const float lse = row_logsumexp(xr, c);
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] = xr[j] - lse;
    } else {
      const float inv = 1.f / exp_shifted_sum(xr, yr, c, row_max(xr, c));
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] *= inv;
    }
  }
}

void softmax_backward(const float* py, const float* pg, float* po, std::int64_t n, std::int64_t c,
                      bool log_form) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* yr = py + r * c;
    const float* gr = pg + r * c;
    float* o = po + r * c;
    float s = 0.f;
    if (log_form) {  // dx = g - softmax * sum(g)
#pragma omp simd reduction(+ : s)
      for (std::int64_t j = 0; j < c; ++j)
        s += gr[j];
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        o[j] = gr[j] - fast_exp(yr[j]) * s;
    } else {  // dx = y * (g - <g, y>)
#pragma omp simd reduction(+ : s)
      for (std::int64_t j = 0; j < c; ++j)
        s += gr[j] * yr[j];
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        o[j] = yr[j] * (gr[j] - s);
    }
  }
}

// ------------------------------------------------------------------ layer norm

// y written as Out: f32, or bf16 (each value rounded as it is stored).
template <class Out>
void layer_norm_to(const float* px, const float* pw, const float* pb, Out* py, float* pm, float* ps,
                   std::int64_t n, std::int64_t c, float eps) {
  const float inv_c = 1.f / static_cast<float>(c);
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c, kParallelGrainMemory))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * c;
    Out* yr = py + r * c;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (std::int64_t j = 0; j < c; ++j)
      s += xr[j];
    const float m = s * inv_c;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (std::int64_t j = 0; j < c; ++j)
      v += (xr[j] - m) * (xr[j] - m);
    const float rs = 1.f / std::sqrt(v * inv_c + eps);
    pm[r] = m;
    ps[r] = rs;
    if (pb) {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] = Out((xr[j] - m) * rs * pw[j] + pb[j]);
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] = Out((xr[j] - m) * rs * pw[j]);
    }
  }
}

void layer_norm(const float* px, const float* pw, const float* pb, float* py, float* pm, float* ps,
                std::int64_t n, std::int64_t c, float eps) {
  layer_norm_to(px, pw, pb, py, pm, ps, n, c, eps);
}

void layer_norm_bf16(const float* px, const float* pw, const float* pb, bf16* py, float* pm,
                     float* ps, std::int64_t n, std::int64_t c, float eps) {
  layer_norm_to(px, pw, pb, py, pm, ps, n, c, eps);
}

// g f32 or bf16 (G); a bf16 row is widened first into a row buffer, so the arithmetic is
// the f32 kernel's, bit for bit.
template <class G>
void layer_norm_backward_of(const float* px, const float* pw, const G* pg, const float* pm,
                            const float* ps, float* pgx, const float* padd, float* dgamma,
                            float* dbeta, std::int64_t n, std::int64_t c) {
  const float inv_c = 1.f / static_cast<float>(c);
  const int nt = threads_for(n * c, kParallelGrainMemory);
  // Per-thread partial sums of dgamma (first c) and dbeta (next c).
  std::vector<float> part(static_cast<std::size_t>(nt) * 2 * c, 0.f);
#pragma omp parallel num_threads(nt)
  {
    float* dw = part.data() + static_cast<std::int64_t>(omp_get_thread_num()) * 2 * c;
    float* db = dw + c;
    std::vector<float> row(std::is_same_v<G, float> ? 0 : static_cast<std::size_t>(c));
    std::vector<float> acc;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      const float* xr = px + r * c;
      const float* gr = nullptr;
      if constexpr (std::is_same_v<G, float>) {
        gr = pg + r * c;
      } else {
        for (std::int64_t j = 0; j < c; ++j)
          row[static_cast<std::size_t>(j)] = static_cast<float>(pg[r * c + j]);
        gr = row.data();
      }
      const float m = pm[r], rs = ps[r];
      float a = 0.f, b = 0.f;
#pragma omp simd reduction(+ : a, b)
      for (std::int64_t j = 0; j < c; ++j) {
        const float xh = (xr[j] - m) * rs;
        const float dxh = gr[j] * pw[j];
        dw[j] += gr[j] * xh;
        db[j] += gr[j];
        a += dxh;
        b += dxh * xh;
      }
      if (!pgx) continue;
      a *= inv_c;
      b *= inv_c;
      float* o = pgx + r * c;
      if (padd) {
        // The norm's own row first (in the thread's row, so that no multiply-add fuses it
        // with the sum), then the partial sum plus it, as the tape's add(partial, gx) (o may
        // be the partial).
        acc.resize(static_cast<std::size_t>(c));
#pragma omp simd
        for (std::int64_t j = 0; j < c; ++j) {
          const float xh = (xr[j] - m) * rs;
          acc[static_cast<std::size_t>(j)] = rs * (gr[j] * pw[j] - a - xh * b);
        }
        const float* ar = padd + r * c;
#pragma omp simd
        for (std::int64_t j = 0; j < c; ++j)
          o[j] = ar[j] + acc[static_cast<std::size_t>(j)];
        continue;
      }
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        const float xh = (xr[j] - m) * rs;
        o[j] = rs * (gr[j] * pw[j] - a - xh * b);
      }
    }
  }
  reduce_partials(part, nt, 2 * c);
  std::memcpy(dgamma, part.data(), static_cast<std::size_t>(c) * sizeof(float));
  if (dbeta) std::memcpy(dbeta, part.data() + c, static_cast<std::size_t>(c) * sizeof(float));
}

void layer_norm_backward(const float* px, const float* pw, const float* pg, const float* pm,
                         const float* ps, float* pgx, const float* padd, float* dgamma,
                         float* dbeta, std::int64_t n, std::int64_t c) {
  layer_norm_backward_of(px, pw, pg, pm, ps, pgx, padd, dgamma, dbeta, n, c);
}

void layer_norm_backward_bf16(const float* px, const float* pw, const bf16* pg, const float* pm,
                              const float* ps, float* pgx, const float* padd, float* dgamma,
                              float* dbeta, std::int64_t n, std::int64_t c) {
  layer_norm_backward_of(px, pw, pg, pm, ps, pgx, padd, dgamma, dbeta, n, c);
}

// ------------------------------------------------------------------ RMS norm

void rms_norm(const float* px, const float* pw, float* py, float* ps, std::int64_t n,
              std::int64_t c, float eps) {
  const float inv_c = 1.f / static_cast<float>(c);
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c, kParallelGrainMemory))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * c;
    float* yr = py + r * c;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (std::int64_t j = 0; j < c; ++j)
      s += xr[j] * xr[j];
    const float rs = 1.f / std::sqrt(s * inv_c + eps);
    ps[r] = rs;
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j)
      yr[j] = xr[j] * rs * pw[j];
  }
}

void rms_norm_backward(const float* px, const float* pw, const float* pg, const float* ps,
                       float* pgx, float* dgamma, std::int64_t n, std::int64_t c) {
  const float inv_c = 1.f / static_cast<float>(c);
  const int nt = threads_for(n * c, kParallelGrainMemory);
  std::vector<float> part(static_cast<std::size_t>(nt) * c, 0.f);
#pragma omp parallel num_threads(nt)
  {
    float* dw = part.data() + static_cast<std::int64_t>(omp_get_thread_num()) * c;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < n; ++r) {
      const float* xr = px + r * c;
      const float* gr = pg + r * c;
      const float rs = ps[r];
      float b = 0.f;
#pragma omp simd reduction(+ : b)
      for (std::int64_t j = 0; j < c; ++j) {
        const float xh = xr[j] * rs;
        dw[j] += gr[j] * xh;
        b += gr[j] * pw[j] * xh;
      }
      if (!pgx) continue;
      b *= inv_c;
      float* o = pgx + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        o[j] = rs * (gr[j] * pw[j] - xr[j] * rs * b);
    }
  }
  reduce_partials(part, nt, c);
  std::memcpy(dgamma, part.data(), static_cast<std::size_t>(c) * sizeof(float));
}

// ------------------------------------------------------------------ embedding

void find_bad_id(const void* ids, DType id_dtype, std::int64_t n, std::int64_t v,
                 std::int64_t* bad) {
  bad[0] = -1;
  bad[1] = 0;
  with_ids(ids, id_dtype, [&](const auto* pi) {
    for (std::int64_t i = 0; i < n; ++i)
      if (!(pi[i] >= 0 && pi[i] < v)) {
        bad[0] = i;
        bad[1] = pi[i];
        return;
      }
  });
}

void embedding(const float* pt, const void* ids, DType id_dtype, float* po, std::int64_t n,
               std::int64_t c, std::int64_t v) {
  with_ids(ids, id_dtype, [&](const auto* pi) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c, kParallelGrainMemory))
    for (std::int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<std::int64_t>(pi[i]);
      if (id >= 0 && id < v)
        std::memcpy(po + i * c, pt + id * c, static_cast<std::size_t>(c) * sizeof(float));
      else
        std::fill(po + i * c, po + (i + 1) * c, std::numeric_limits<float>::quiet_NaN());
    }
  });
}

void embedding_backward(const float* pg, const void* ids, DType id_dtype, float* po, std::int64_t n,
                        std::int64_t c, std::int64_t v) {
  with_ids(ids, id_dtype, [&](const auto* pi) {
  // Scatter-add with each thread owning a range of columns: no races, and the sum
  // over repeated ids runs in id order, so the result is deterministic.
#pragma omp parallel num_threads(threads_for(n* c, kParallelGrainMemory))
    {
      const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const std::int64_t c0 = c * t / nt, c1 = c * (t + 1) / nt;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto id = static_cast<std::int64_t>(pi[i]);
        if (id < 0 || id >= v) continue;
        float* dst = po + id * c;
        const float* src = pg + i * c;
#pragma omp simd
        for (std::int64_t j = c0; j < c1; ++j)
          dst[j] += src[j];
      }
    }
  });
}

// ------------------------------------------------------------------ cross-entropy

// One row's log-sum-exp into *lse and its loss (NaN for a label outside [0, v)).
float cross_entropy_row(const float* xr, std::int64_t label, std::int64_t v, float* lse) {
  *lse = row_logsumexp(xr, v);
  return label >= 0 && label < v ? *lse - xr[label] : std::numeric_limits<float>::quiet_NaN();
}

// One row's gradient in f32: d loss / d x_j = gr (softmax_j - [j == label]).
void cross_entropy_row_grad(const float* xr, float gr, float l, std::int64_t label, float* o,
                            std::int64_t v) {
#pragma omp simd
  for (std::int64_t j = 0; j < v; ++j)
    o[j] = gr * fast_exp(xr[j] - l);
  if (label >= 0 && label < v) o[label] -= gr;
}

void cross_entropy(const float* px, const void* labels, DType id_dtype, float* pl, float* ps,
                   std::int64_t n, std::int64_t v) {
  with_ids(labels, id_dtype, [&](const auto* pi) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* v))
    for (std::int64_t r = 0; r < n; ++r)
      pl[r] = cross_entropy_row(px + r * v, static_cast<std::int64_t>(pi[r]), v, ps + r);
  });
}

void cross_entropy_backward(const float* px, const float* pg, const float* ps, const void* labels,
                            DType id_dtype, float* po, std::int64_t n, std::int64_t v) {
  with_ids(labels, id_dtype, [&](const auto* pi) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* v))
    for (std::int64_t r = 0; r < n; ++r)
      cross_entropy_row_grad(px + r * v, pg[r], ps[r], static_cast<std::int64_t>(pi[r]), po + r * v,
                             v);
  });
}

// Per row: its loss and lse, then its gradient, in f32 (over the logits when gx is them) or
// in the thread's f32 row and rounded from there: the bits of cross_entropy,
// cross_entropy_backward and a cast, the row read while it is in the cache. Logits in bf16
// or f16 are widened into the thread's f32 row first (the bits of a cast to f32).
void cross_entropy_with_grad(const void* logits, DType logits_dtype, const void* labels,
                             DType id_dtype, float* pl, float* ps, const float* pg, void* gx,
                             DType gx_dtype, std::int64_t n, std::int64_t v) {
  const auto row_bytes = [v](DType t) { return v * static_cast<std::int64_t>(dtype_size(t)); };
  with_ids(labels, id_dtype, [&](const auto* pi) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n* v))
    for (std::int64_t r = 0; r < n; ++r) {
      thread_local std::vector<float> wide, row;
      const float* xr = static_cast<const float*>(logits) + r * v;
      if (logits_dtype != DType::F32) {
        if (wide.size() < static_cast<std::size_t>(v)) wide.resize(static_cast<std::size_t>(v));
        copy_kernels.convert(static_cast<const char*>(logits) + r * row_bytes(logits_dtype),
                             logits_dtype, wide.data(), DType::F32, v, Stream{});
        xr = wide.data();
      }
      const auto label = static_cast<std::int64_t>(pi[r]);
      pl[r] = cross_entropy_row(xr, label, v, ps + r);
      if (gx_dtype == DType::F32) {
        cross_entropy_row_grad(xr, pg[r], ps[r], label, static_cast<float*>(gx) + r * v, v);
        continue;
      }
      if (row.size() < static_cast<std::size_t>(v)) row.resize(static_cast<std::size_t>(v));
      cross_entropy_row_grad(xr, pg[r], ps[r], label, row.data(), v);
      copy_kernels.convert(row.data(), DType::F32, static_cast<char*>(gx) + r * row_bytes(gx_dtype),
                           gx_dtype, v, Stream{});
    }
  });
}

// ------------------------------------------------------------------ dropout

// Inverted dropout with the keep-mask drawn from the key (the forward and the backward
// draw the same mask).
void dropout(const float* src, float* dst, std::int64_t n, const DropoutMask& mask,
             const std::int64_t* run_offsets) {
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n));
  if (!run_offsets) {
    random_bernoulli(mask.key, keep.data(), n, mask.keep);
  } else {
    for (std::int64_t local = 0, r = 0; local < n; local += mask.run, ++r)
      random_bernoulli(mask.key, keep.data() + local, mask.run, mask.keep, run_offsets[r]);
  }
  const std::uint8_t* pm = keep.data();
  const float scale = mask.scale;
#pragma omp parallel for simd num_threads(threads_for(n, kParallelGrainMemory))
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = pm[i] ? src[i] * scale : 0.f;
}

}  // namespace

const NnKernels nn_kernels{
    .softmax = softmax,
    .softmax_backward = softmax_backward,
    .layer_norm = layer_norm,
    .layer_norm_bf16 = layer_norm_bf16,
    .layer_norm_backward = layer_norm_backward,
    .layer_norm_backward_bf16 = layer_norm_backward_bf16,
    .rms_norm = rms_norm,
    .rms_norm_backward = rms_norm_backward,
    .find_bad_id = find_bad_id,
    .embedding = embedding,
    .embedding_backward = embedding_backward,
    .cross_entropy = cross_entropy,
    .cross_entropy_backward = cross_entropy_backward,
    .cross_entropy_with_grad = cross_entropy_with_grad,
    .dropout = dropout,
};

}  // namespace distjax::tensor::detail::cpu
