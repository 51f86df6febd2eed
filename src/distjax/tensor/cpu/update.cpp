// CPU kernels: the optimizers' fused updates, a sum of squares and a scale in place. Each is
// one pass over its leaf, bound by memory traffic; the multi-leaf forms call the per-leaf
// ones leaf by leaf (no launch cost to save here), so their bits are the per-leaf bits.
#include <cmath>

#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Elements above which the Adam update runs on all OpenMP threads (7 streams of 4 bytes
// per element: ~1 MiB of traffic at the threshold, well above a fork/join's cost).
constexpr std::int64_t kParallelAdamGrain = 32768;

void sgd(float* __restrict pp, const float* __restrict gp, std::int64_t n, float lr, float wd) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    pp[i] -= lr * (gp[i] + wd * pp[i]);
}

void sgd_momentum(float* __restrict pp, const float* __restrict gp, float* __restrict buf,
                  std::int64_t n, float lr, float mu, float wd, bool nesterov) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = gp[i] + wd * pp[i];
    const float bi = mu * buf[i] + gi;
    buf[i] = bi;
    pp[i] -= lr * (nesterov ? gi + mu * bi : bi);
  }
}

void adam(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
          std::int64_t n, double lr, double b1, double b2, double eps, std::int64_t t, double decay,
          double l2) {
  // PyTorch's formulation: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps.
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
  const float c1 = static_cast<float>(1.0 - b1), c2 = static_cast<float>(1.0 - b2);
  const float feps = static_cast<float>(eps), fdecay = static_cast<float>(decay);
  const float fl2 = static_cast<float>(l2);
  // Elementwise (no reduction), so the result does not depend on the thread count; large
  // leaves are split over the OpenMP threads instead of leaving the other cores idle
  // (the GPT benchmark's AdamW update was ~4% of a 2-thread step on one thread).
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelAdamGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * fdecay;
    const float gi = g[i] + fl2 * pi;
    const float mi = fb1 * m[i] + c1 * gi;
    const float vi = fb2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + feps);
  }
}

void sgd_many(const OptimLeaf* leaves, std::int64_t count, float lr, float wd) {
  for (std::int64_t i = 0; i < count; ++i)
    sgd(leaves[i].p, leaves[i].g, leaves[i].n, lr, wd);
}

void sgd_momentum_many(const OptimLeaf* leaves, std::int64_t count, float lr, float mu, float wd,
                       bool nesterov) {
  for (std::int64_t i = 0; i < count; ++i) {
    const OptimLeaf& l = leaves[i];
    sgd_momentum(l.p, l.g, l.m, l.n, lr, mu, wd, nesterov);
  }
}

void adam_many(const OptimLeaf* leaves, std::int64_t count, double lr, double b1, double b2,
               double eps, std::int64_t t, double l2) {
  for (std::int64_t i = 0; i < count; ++i) {
    const OptimLeaf& l = leaves[i];
    adam(l.p, l.g, l.m, l.v, l.n, lr, b1, b2, eps, t, l.decay, l2);
  }
}

void sum_squares(const float* p, std::int64_t n, double* host_out) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (std::int64_t i = 0; i < n; ++i)
    acc += static_cast<double>(p[i]) * p[i];
  *host_out = acc;
}

void sum_squares_many(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                      double* host_out) {
  for (std::int64_t i = 0; i < count; ++i)
    sum_squares(xs[i], ns[i], host_out + i);
}

void scale(float* p, std::int64_t n, float f) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    p[i] *= f;
}

void norm_and_clip_factor(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                          double max_norm, float* norm_out, float* factor_out) {
  double total = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    double leaf = 0.0;
    sum_squares(xs[i], ns[i], &leaf);
    total += leaf;
  }
  const double norm = std::sqrt(total);
  *norm_out = static_cast<float>(norm);
  *factor_out = max_norm > 0.0 && norm > max_norm ? static_cast<float>(max_norm / norm) : 1.0f;
}

void scale_by(float* p, std::int64_t n, const float* factor) {
  scale(p, n, *factor);
}

}  // namespace

const UpdateKernels update_kernels{
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

}  // namespace distjax::tensor::detail::cpu
