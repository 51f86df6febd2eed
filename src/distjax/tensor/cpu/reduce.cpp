// CPU kernels: sum and max over the middle of (outer, r, inner), max's backward and argmax.
#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

template <ReduceOp Op>
inline float combine(float a, float b) {
  if constexpr (Op == ReduceOp::Sum)
    return a + b;
  else
    return b > a ? b : a;
}

template <ReduceOp Op>
constexpr float reduce_init() {
  return Op == ReduceOp::Sum ? 0.f : -std::numeric_limits<float>::infinity();
}

// dst[o, i] = combine over j in [j0, j1) of src[o, j, i], for x viewed as (outer, r, inner).
template <ReduceOp Op>
void reduce_block(const float* px, float* dst, std::int64_t o0, std::int64_t o1, std::int64_t r,
                  std::int64_t inner, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t o = o0; o < o1; ++o) {
    if (inner == 1) {
      const float* row = px + o * r;
      float acc = reduce_init<Op>();
      if constexpr (Op == ReduceOp::Sum) {
#pragma omp simd reduction(+ : acc)
        for (std::int64_t j = j0; j < j1; ++j)
          acc += row[j];
      } else {
#pragma omp simd reduction(max : acc)
        for (std::int64_t j = j0; j < j1; ++j)
          acc = std::max(acc, row[j]);
      }
      dst[o] = acc;
      continue;
    }
    float* d = dst + o * inner;
    std::fill(d, d + inner, reduce_init<Op>());
    for (std::int64_t j = j0; j < j1; ++j) {
      const float* src = px + (o * r + j) * inner;
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i)
        d[i] = combine<Op>(d[i], src[i]);
    }
  }
}

// Parallel over `outer` when it has enough rows for every thread, else over chunks of
// `r` into per-thread partials combined in thread order (deterministic for a given
// thread count): the (N, C) -> (C) bias-gradient case takes the second path.
template <ReduceOp Op>
void reduce_middle(const float* px, float* po, std::int64_t outer, std::int64_t r,
                   std::int64_t inner) {
  const std::int64_t work = outer * r * inner;
  const int nt = work > kParallelGrainMemory ? omp_get_max_threads() : 1;
  if (nt == 1 || r <= 1) {
    reduce_block<Op>(px, po, 0, outer, r, inner, 0, r);
  } else if (outer >= 4 * nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (std::int64_t o = 0; o < outer; ++o)
      reduce_block<Op>(px, po, o, o + 1, r, inner, 0, r);
  } else {
    const std::int64_t len = outer * inner;
    std::vector<float> part(static_cast<std::size_t>(nt * len), reduce_init<Op>());
#pragma omp parallel num_threads(nt)
    {
      const std::int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      reduce_block<Op>(px, part.data() + t * len, 0, outer, r, inner, r * t / n, r * (t + 1) / n);
    }
    std::copy(part.begin(), part.begin() + len, po);
    for (int t = 1; t < nt; ++t) {
      const float* src = part.data() + t * len;
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i)
        po[i] = combine<Op>(po[i], src[i]);
    }
  }
}

void reduce(ReduceOp op, const float* x, float* out, std::int64_t outer, std::int64_t r,
            std::int64_t inner) {
  if (op == ReduceOp::Sum)
    reduce_middle<ReduceOp::Sum>(x, out, outer, r, inner);
  else
    reduce_middle<ReduceOp::Max>(x, out, outer, r, inner);
}

void max_grad_run(const float* px, const float* pm, const float* pg, float* po, std::int64_t outer,
                  std::int64_t r, std::int64_t inner) {
#pragma omp parallel for if (outer * r * inner > kParallelGrainMemory)
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const float m = pm[o * inner + i];
      for (std::int64_t j = 0; j < r; ++j) {
        const std::int64_t at = (o * r + j) * inner + i;
        if (px[at] == m) {
          po[at] = pg[o * inner + i];
          break;
        }
      }
    }
}

void max_grad_general(const float* px, const float* pm, const float* pg, float* po, std::int64_t n,
                      const BroadcastPlan& groups, std::int64_t ngroups) {
  std::vector<char> taken(static_cast<std::size_t>(ngroups), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (px[i] != pm[i]) continue;
    std::int64_t group = broadcast_index(groups, i);
    if (taken[group]) continue;
    taken[group] = 1;
    po[i] = pg[i];
  }
}

void argmax(const float* px, std::int64_t* po, std::int64_t outer, std::int64_t r,
            std::int64_t inner) {
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      std::int64_t best = 0;
      for (std::int64_t j = 1; j < r; ++j)
        if (px[(o * r + j) * inner + i] > px[(o * r + best) * inner + i]) best = j;
      po[o * inner + i] = best;
    }
}

}  // namespace

const ReduceKernels reduce_kernels{
    .reduce = reduce,
    .max_grad_run = max_grad_run,
    .max_grad_general = max_grad_general,
    .argmax = argmax,
};

}  // namespace distjax::tensor::detail::cpu
