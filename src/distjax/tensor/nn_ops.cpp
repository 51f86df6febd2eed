// Fused NN ops over rows: x (..., C) is viewed as (N, C) and each row is handled in one
// pass while it sits in L1. Each op's backward follows its forward.
#include "distjax/tensor/nn_ops.hpp"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::tensor {
namespace {

using detail::kParallelGrain;
using detail::kParallelGrainMemory;

// x (..., C) viewed as n rows of c. Callers copy n and c into variables rather than bind
// them (auto [n, c]): clang before 16 cannot use a structured binding inside a lambda or an
// OpenMP region.
struct Rows {
  std::int64_t n, c;
};

Rows as_rows(const Tensor& x) {
  const std::int64_t c = x.rank() ? x.size(-1) : 1;
  return {c ? x.numel() / c : 0, c};
}

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

void check_vector(const char* op, const char* what, const Tensor& p, std::int64_t c,
                  const Tensor& x) {
  detail::require_f32(op, {&p});
  DISTJAX_CHECK(p.rank() == 1 && p.size(0) == c, InvalidArgument, "[", op, "] ", what,
                " has shape ", to_string(p.shape()), " but x ", to_string(x.shape()), " needs (", c,
                ")");
}

// Moves `axis` last (and back): softmax over another axis is the last-axis kernel
// between two differentiable permutes.
std::vector<int> axis_last_perm(int rank, int axis) {
  std::vector<int> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + axis);
  perm.push_back(axis);
  return perm;
}

// ------------------------------------------------------------------ softmax

Tensor softmax_last(const Tensor& x, bool log_form) {
  const char* op = log_form ? "log_softmax" : "softmax";
  const Rows rc = as_rows(x);
  const std::int64_t n = rc.n, c = rc.c;
  Tensor y = Tensor::empty(x.shape());
  const float* px = x.data<float>();
  float* py = y.data<float>();
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * c;
    float* yr = py + r * c;
    if (log_form) {
      const float lse = detail::row_logsumexp(xr, c);
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] = xr[j] - lse;
    } else {
      const float inv = 1.f / detail::exp_shifted_sum(xr, yr, c, detail::row_max(xr, c));
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] *= inv;
    }
  }
  if (!needs_grad({&x})) return joined(y, {&x});
  return record(op, {x}, y, [yd = y.detach(), log_form](const std::vector<Tensor>& g) {
    const Rows rc = as_rows(yd);
    const std::int64_t n = rc.n, c = rc.c;
    Tensor gx = Tensor::empty(yd.shape());
    const float* py = yd.data<float>();
    const float* pg = g[0].data<float>();
    float* po = gx.data<float>();
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
          o[j] = gr[j] - detail::fast_exp(yr[j]) * s;
      } else {  // dx = y * (g - <g, y>)
#pragma omp simd reduction(+ : s)
        for (std::int64_t j = 0; j < c; ++j)
          s += gr[j] * yr[j];
#pragma omp simd
        for (std::int64_t j = 0; j < c; ++j)
          o[j] = yr[j] * (gr[j] - s);
      }
    }
    return std::vector<Tensor>{gx};
  });
}

Tensor softmax_axis(const Tensor& x, int axis_in, bool log_form) {
  const char* op = log_form ? "log_softmax" : "softmax";
  detail::require_f32(op, {&x});
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[", op, "] needs rank >= 1, got a scalar");
  const int axis = normalize_axis(axis_in, x.rank(), op);
  if (axis == x.rank() - 1) return softmax_last(x, log_form);
  const std::vector<int> perm = axis_last_perm(x.rank(), axis);
  std::vector<int> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inv[perm[i]] = static_cast<int>(i);
  return permute(softmax_last(permute(x, perm), log_form), inv);
}

}  // namespace

Tensor softmax(const Tensor& x, int axis) {
  return softmax_axis(x, axis, false);
}
Tensor log_softmax(const Tensor& x, int axis) {
  return softmax_axis(x, axis, true);
}

// ------------------------------------------------------------------ layer norm

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  detail::require_f32("layer_norm", {&x});
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[layer_norm] needs x of rank >= 1, got a scalar");
  const Rows rc = as_rows(x);
  const std::int64_t n = rc.n, c = rc.c;
  check_vector("layer_norm", "gamma", gamma, c, x);
  if (beta.defined()) check_vector("layer_norm", "beta", beta, c, x);
  Tensor y = Tensor::empty(x.shape());
  Tensor mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  const float* px = x.data<float>();
  const float* pw = gamma.data<float>();
  const float* pb = beta.defined() ? beta.data<float>() : nullptr;
  float* py = y.data<float>();
  float* pm = mean.data<float>();
  float* ps = rstd.data<float>();
  const float inv_c = 1.f / static_cast<float>(c);
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c, kParallelGrainMemory))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * c;
    float* yr = py + r * c;
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
        yr[j] = (xr[j] - m) * rs * pw[j] + pb[j];
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        yr[j] = (xr[j] - m) * rs * pw[j];
    }
  }
  std::vector<Tensor> inputs{x, gamma};
  if (beta.defined()) inputs.push_back(beta);
  if (!needs_grad(inputs)) return joined(y, inputs);
  return record(
      "layer_norm", inputs, y,
      [xd = x.detach(), wd = gamma.detach(), mean, rstd, has_beta = beta.defined(),
       rx = x.requires_grad()](const std::vector<Tensor>& g) {
        const Rows rc = as_rows(xd);
        const std::int64_t n = rc.n, c = rc.c;
        const float* px = xd.data<float>();
        const float* pw = wd.data<float>();
        const float* pg = g[0].data<float>();
        const float* pm = mean.data<float>();
        const float* ps = rstd.data<float>();
        Tensor gx = rx ? Tensor::empty(xd.shape()) : Tensor();
        float* pgx = rx ? gx.data<float>() : nullptr;
        const float inv_c = 1.f / static_cast<float>(c);
        const int nt = threads_for(n * c, kParallelGrainMemory);
        // Per-thread partial sums of dgamma (first c) and dbeta (next c).
        std::vector<float> part(static_cast<std::size_t>(nt) * 2 * c, 0.f);
#pragma omp parallel num_threads(nt)
        {
          float* dw = part.data() + static_cast<std::int64_t>(omp_get_thread_num()) * 2 * c;
          float* db = dw + c;
#pragma omp for schedule(static)
          for (std::int64_t r = 0; r < n; ++r) {
            const float* xr = px + r * c;
            const float* gr = pg + r * c;
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
#pragma omp simd
            for (std::int64_t j = 0; j < c; ++j) {
              const float xh = (xr[j] - m) * rs;
              o[j] = rs * (gr[j] * pw[j] - a - xh * b);
            }
          }
        }
        reduce_partials(part, nt, 2 * c);
        Tensor gw = Tensor::from_vector(std::vector<float>(part.begin(), part.begin() + c), {c});
        std::vector<Tensor> out{gx, gw};
        if (has_beta)
          out.push_back(
              Tensor::from_vector(std::vector<float>(part.begin() + c, part.begin() + 2 * c), {c}));
        return out;
      });
}

// ------------------------------------------------------------------ RMS norm

Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  detail::require_f32("rms_norm", {&x});
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[rms_norm] needs x of rank >= 1, got a scalar");
  const Rows rc = as_rows(x);
  const std::int64_t n = rc.n, c = rc.c;
  check_vector("rms_norm", "gamma", gamma, c, x);
  Tensor y = Tensor::empty(x.shape());
  Tensor rrms = Tensor::empty({n});
  const float* px = x.data<float>();
  const float* pw = gamma.data<float>();
  float* py = y.data<float>();
  float* ps = rrms.data<float>();
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
  if (!needs_grad({&x, &gamma})) return joined(y, {&x, &gamma});
  return record("rms_norm", {x, gamma}, y,
                [xd = x.detach(), wd = gamma.detach(), rrms,
                 rx = x.requires_grad()](const std::vector<Tensor>& g) {
                  const Rows rc = as_rows(xd);
                  const std::int64_t n = rc.n, c = rc.c;
                  const float* px = xd.data<float>();
                  const float* pw = wd.data<float>();
                  const float* pg = g[0].data<float>();
                  const float* ps = rrms.data<float>();
                  Tensor gx = rx ? Tensor::empty(xd.shape()) : Tensor();
                  float* pgx = rx ? gx.data<float>() : nullptr;
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
                  part.resize(c);
                  return std::vector<Tensor>{gx, Tensor::from_vector(part, {c})};
                });
}

// ------------------------------------------------------------------ embedding

namespace {

// Ids as i64 after checking they are integers in [0, v).
std::vector<std::int64_t> checked_ids(const char* op, const Tensor& ids, std::int64_t v) {
  check_defined(ids, op, "ids");
  detail::require_cpu(op, {&ids});
  DISTJAX_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, InvalidArgument, "[", op,
                "] ids/labels must be i32 or i64, got ", dtype_name(ids.dtype()));
  std::vector<std::int64_t> out(static_cast<std::size_t>(ids.numel()));
  if (ids.dtype() == DType::I32) {
    const std::int32_t* p = ids.data<std::int32_t>();
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = p[i];
  } else {
    const std::int64_t* p = ids.data<std::int64_t>();
    std::copy(p, p + out.size(), out.begin());
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    DISTJAX_CHECK(out[i] >= 0 && out[i] < v, InvalidArgument, "[", op, "] id ", out[i],
                  " at flat index ", i, " is outside [0, ", v, ")");
  return out;
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  detail::require_f32("embedding", {&table});
  DISTJAX_CHECK(table.rank() == 2, InvalidArgument, "[embedding] table must be (V, C), got ",
                to_string(table.shape()));
  const std::int64_t v = table.size(0), c = table.size(1);
  auto idx = std::make_shared<const std::vector<std::int64_t>>(checked_ids("embedding", ids, v));
  Shape os = ids.shape();
  os.push_back(c);
  Tensor out = Tensor::empty(os);
  const float* pt = table.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = static_cast<std::int64_t>(idx->size());
  const std::int64_t* pi = idx->data();
#pragma omp parallel for schedule(static) num_threads(threads_for(n* c, kParallelGrainMemory))
  for (std::int64_t i = 0; i < n; ++i)
    std::memcpy(po + i * c, pt + pi[i] * c, static_cast<std::size_t>(c) * sizeof(float));
  // ids join the varying axes (a batch sharded over "data" gives rows that vary over it).
  if (!needs_grad({&table})) return joined(out, {&table, &ids});
  return record("embedding", {table, ids}, out, [idx, v, c](const std::vector<Tensor>& g) {
    Tensor gt = Tensor::zeros({v, c});
    const float* pg = g[0].data<float>();
    float* po = gt.data<float>();
    const std::int64_t n = static_cast<std::int64_t>(idx->size());
    const std::int64_t* pi = idx->data();
    // Scatter-add with each thread owning a range of columns: no races, and the sum
    // over repeated ids runs in id order, so the result is deterministic.
#pragma omp parallel num_threads(threads_for(n* c, kParallelGrainMemory))
    {
      const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const std::int64_t c0 = c * t / nt, c1 = c * (t + 1) / nt;
      for (std::int64_t i = 0; i < n; ++i) {
        float* dst = po + pi[i] * c;
        const float* src = pg + i * c;
#pragma omp simd
        for (std::int64_t j = c0; j < c1; ++j)
          dst[j] += src[j];
      }
    }
    return std::vector<Tensor>{gt, Tensor()};
  });
}

// ------------------------------------------------------------------ cross-entropy

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  detail::require_f32("cross_entropy", {&logits});
  DISTJAX_CHECK(logits.rank() >= 1, InvalidArgument,
                "[cross_entropy] logits need rank >= 1, got a scalar");
  Shape ls(logits.shape().begin(), logits.shape().end() - 1);
  check_defined(labels, "cross_entropy", "labels");
  DISTJAX_CHECK(labels.shape() == ls, InvalidArgument, "[cross_entropy] labels ",
                to_string(labels.shape()), " do not match logits ", to_string(logits.shape()),
                " (expected labels ", to_string(ls), ")");
  const Rows rc = as_rows(logits);
  const std::int64_t n = rc.n, v = rc.c;
  auto lab =
      std::make_shared<const std::vector<std::int64_t>>(checked_ids("cross_entropy", labels, v));
  Tensor loss = Tensor::empty(ls);
  Tensor lse = Tensor::empty({n});
  const float* px = logits.data<float>();
  float* pl = loss.data<float>();
  float* ps = lse.data<float>();
  const std::int64_t* pi = lab->data();
#pragma omp parallel for schedule(static) num_threads(threads_for(n* v))
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = px + r * v;
    ps[r] = detail::row_logsumexp(xr, v);
    pl[r] = ps[r] - xr[pi[r]];
  }
  if (!needs_grad({&logits})) return joined(loss, {&logits, &labels});
  return record("cross_entropy", {logits, labels}, loss,
                [xd = logits.detach(), lse, lab](const std::vector<Tensor>& g) {
                  const Rows rc = as_rows(xd);
                  const std::int64_t n = rc.n, v = rc.c;
                  Tensor gx = Tensor::empty(xd.shape());
                  const float* px = xd.data<float>();
                  const float* pg = g[0].data<float>();
                  const float* ps = lse.data<float>();
                  const std::int64_t* pi = lab->data();
                  float* po = gx.data<float>();
    // d loss_r / d x_rj = softmax_rj - [j == label_r]
#pragma omp parallel for schedule(static) num_threads(threads_for(n* v))
                  for (std::int64_t r = 0; r < n; ++r) {
                    const float* xr = px + r * v;
                    float* o = po + r * v;
                    const float gr = pg[r], l = ps[r];
#pragma omp simd
                    for (std::int64_t j = 0; j < v; ++j)
                      o[j] = gr * detail::fast_exp(xr[j] - l);
                    o[pi[r]] -= gr;
                  }
                  return std::vector<Tensor>{gx, Tensor()};
                });
}

// ------------------------------------------------------------------ dropout

namespace {

// Inverted dropout of x with a given keep-mask (forward and backward apply the same mask).
Tensor dropout_with_mask(const Tensor& x, float rate,
                         std::shared_ptr<std::vector<std::uint8_t>> mask) {
  const std::int64_t n = x.numel();
  const float scale = 1.f / (1.f - rate);
  auto apply = [mask, scale, n](const float* src, float* dst) {
    const std::uint8_t* pm = mask->data();
#pragma omp parallel for simd num_threads(threads_for(n, kParallelGrainMemory))
    for (std::int64_t i = 0; i < n; ++i)
      dst[i] = pm[i] ? src[i] * scale : 0.f;
  };
  Tensor y = Tensor::empty(x.shape());
  apply(x.data<float>(), y.data<float>());
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("dropout", {x}, y, [apply](const std::vector<Tensor>& g) {
    Tensor gx = Tensor::empty(g[0].shape());
    apply(g[0].data<float>(), gx.data<float>());
    return std::vector<Tensor>{gx};
  });
}

void check_rate(const Tensor& x, float rate) {
  detail::require_f32("dropout", {&x});
  DISTJAX_CHECK(rate >= 0.f && rate < 1.f, InvalidArgument,
                "[dropout] rate must be in [0, 1), got ", rate);
}

}  // namespace

Tensor dropout(const Tensor& x, float rate, const Key& key) {
  check_rate(x, rate);
  if (rate == 0.f) return x;
  const std::int64_t n = x.numel();
  auto mask = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(n));
  random_bernoulli(key, mask->data(), n, 1.f - rate);
  return dropout_with_mask(x, rate, std::move(mask));
}

Tensor dropout(const Tensor& x, float rate, const Key& key, const Shape& global,
               const std::vector<std::int64_t>& block_start) {
  check_rate(x, rate);
  const int r = x.rank();
  bool inside =
      r >= 1 && static_cast<int>(global.size()) == r && static_cast<int>(block_start.size()) == r;
  for (int d = 0; inside && d < r; ++d)
    inside = block_start[d] >= 0 && block_start[d] + x.size(d) <= global[d];
  DISTJAX_CHECK(inside, InvalidArgument, "[dropout] block ", to_string(x.shape()),
                " does not lie inside ", to_string(global), " at the given start");
  if (rate == 0.f) return x;
  const std::int64_t n = x.numel(), row = x.size(r - 1);
  auto mask = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(n));
  // Each contiguous row of the block draws its stream positions from the global index.
  for (std::int64_t local = 0; local < n; local += row) {
    std::int64_t g = 0, stride = global[r - 1], rem = local / row;
    for (int d = r - 1; d-- > 0;) {
      g += (block_start[d] + rem % x.size(d)) * stride;
      rem /= x.size(d);
      stride *= global[d];
    }
    random_bernoulli(key, mask->data() + local, row, 1.f - rate, g + block_start[r - 1]);
  }
  return dropout_with_mask(x, rate, std::move(mask));
}

}  // namespace distjax::tensor
