// CPU kernels: Mixture-of-Experts routing (top-k, the dispatch plan, dispatch and combine)
// and the grouped products over experts (oneDNN's sgemm per group).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <omp.h>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

void top_k(const float* scores, std::int64_t n, std::int64_t e, std::int64_t k,
           std::int32_t* indices) {
#pragma omp parallel for schedule(static) if (n * e > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = scores + i * e;
    std::int32_t* out = indices + i * k;
    // Insertion into the k best so far: larger first, of equal values the lower column.
    std::int64_t held = 0;
    for (std::int32_t c = 0; c < e; ++c) {
      const float v = row[c];
      std::int64_t at = held;
      while (at > 0 && row[out[at - 1]] < v) --at;
      if (at >= k) continue;
      for (std::int64_t j = std::min(held, k - 1); j > at; --j) out[j] = out[j - 1];
      out[at] = c;
      held = std::min(held + 1, k);
    }
  }
}

void take_columns(const float* src, const std::int32_t* idx, std::int64_t n, std::int64_t e,
                  std::int64_t k, float* out) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < k; ++j)
      out[i * k + j] = src[i * e + idx[i * k + j]];
}

void take_columns_backward(const float* g, const std::int32_t* idx, std::int64_t n,
                           std::int64_t e, std::int64_t k, float* dsrc) {
  std::fill(dsrc, dsrc + n * e, 0.f);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < k; ++j)
      dsrc[i * e + idx[i * k + j]] += g[i * k + j];
}

void dispatch_plan(const std::int32_t* experts, const float* priority, std::int64_t n,
                   std::int64_t k, std::int64_t e, std::int64_t capacity,
                   std::int32_t* position, std::int32_t* counts) {
  const std::int64_t pairs = n * k;
  // Each expert's pairs in token order (a stable counting sort).
  std::vector<std::int64_t> start(static_cast<std::size_t>(e) + 1, 0);
  for (std::int64_t i = 0; i < pairs; ++i) ++start[static_cast<std::size_t>(experts[i]) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<std::int64_t> order(static_cast<std::size_t>(pairs));
  {
    std::vector<std::int64_t> next(start.begin(), start.end() - 1);
    for (std::int64_t i = 0; i < pairs; ++i)
      order[static_cast<std::size_t>(next[static_cast<std::size_t>(experts[i])]++)] = i;
  }
  std::fill(position, position + pairs, -1);
  std::int32_t row = 0;
  std::vector<std::int64_t> kept;
  for (std::int64_t g = 0; g < e; ++g) {
    const auto first = order.begin() + start[static_cast<std::size_t>(g)];
    const auto last = order.begin() + start[static_cast<std::size_t>(g) + 1];
    kept.assign(first, last);
    const std::int64_t keep =
        capacity < 0 ? std::int64_t(kept.size()) : std::min<std::int64_t>(capacity, kept.size());
    if (priority != nullptr && keep < std::int64_t(kept.size())) {
      // The `keep` highest priorities (earlier pairs first among equals), back in token order.
      std::stable_sort(kept.begin(), kept.end(), [priority](std::int64_t a, std::int64_t b) {
        return priority[a] > priority[b];
      });
      std::sort(kept.begin(), kept.begin() + keep);
    }
    for (std::int64_t j = 0; j < keep; ++j) position[kept[static_cast<std::size_t>(j)]] = row++;
    counts[g] = static_cast<std::int32_t>(keep);
  }
}

void combine(const float* src, const std::int32_t* position, const float* gates, std::int64_t n,
             std::int64_t k, std::int64_t d, float* y) {
#pragma omp parallel for schedule(static) if (n * k * d > kParallelGrainMemory)
  for (std::int64_t t = 0; t < n; ++t) {
    float* out = y + t * d;
    std::fill(out, out + d, 0.f);
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int32_t p = position[t * k + s];
      if (p < 0) continue;
      const float* row = src + std::int64_t(p) * d;
      const float w = gates ? gates[t * k + s] : 1.f;
      if (gates)
        for (std::int64_t c = 0; c < d; ++c) out[c] = std::fma(w, row[c], out[c]);
      else
        for (std::int64_t c = 0; c < d; ++c) out[c] += row[c];
    }
  }
}

void combine_backward(const float* g, const float* src, const std::int32_t* position,
                      const float* gates, std::int64_t n, std::int64_t k, std::int64_t d,
                      float* dst, float* dgates) {
#pragma omp parallel for schedule(static) if (n * k * d > kParallelGrainMemory)
  for (std::int64_t t = 0; t < n; ++t) {
    const float* gt = g + t * d;
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int32_t p = position[t * k + s];
      if (p < 0) {
        if (dgates) dgates[t * k + s] = 0.f;
        continue;
      }
      float* out = dst + std::int64_t(p) * d;
      if (gates) {
        const float w = gates[t * k + s];
        for (std::int64_t c = 0; c < d; ++c) out[c] = w * gt[c];
      } else {
        std::memcpy(out, gt, static_cast<std::size_t>(d) * sizeof(float));
      }
      if (dgates) {
        const float* row = src + std::int64_t(p) * d;
        float dot = 0.f;
        for (std::int64_t c = 0; c < d; ++c) dot = std::fma(gt[c], row[c], dot);
        dgates[t * k + s] = dot;
      }
    }
  }
}

// `count` elements of `from` in f32: the pointer itself for f32, else widened into the
// calling thread's buffer `slot` (read by the tasks on other threads until it returns).
const float* as_f32(const void* from, DType dtype, std::int64_t count, int slot) {
  if (dtype == DType::F32) return static_cast<const float*>(from);
  thread_local std::vector<float> buffers[2];
  std::vector<float>& w = buffers[slot];
  if (w.size() < static_cast<std::size_t>(count)) w.resize(static_cast<std::size_t>(count));
  copy_kernels.convert(from, dtype, w.data(), DType::F32, count, Stream{});
  return w.data();
}

// A block of one group's product: group g's rows, output columns [n0, n1).
struct GroupTask {
  std::int64_t g, n0, n1;
};

// The groups' products cut in tasks of at most 256 output columns (the cut depends on the
// shape only). Run as they are, one sgemm per group split over the threads, small groups pay
// a fork and a join each and are split thinner than pays; with at least two tasks per thread
// the tasks are spread over the threads instead, each a one-thread sgemm: one fork and join
// for all of them. Either way each output element is one sgemm's sum of its k products, and
// a run repeats bit for bit at a given number of threads.
std::vector<GroupTask> group_tasks(const std::int64_t* offsets, std::int64_t groups, std::int64_t n,
                                   bool skip_empty) {
  const std::int64_t parts = std::max<std::int64_t>(1, (n + 255) / 256);
  std::vector<GroupTask> tasks;
  for (std::int64_t g = 0; g < groups; ++g) {
    if (skip_empty && offsets[g + 1] == offsets[g]) continue;
    for (std::int64_t p = 0; p < parts; ++p)
      tasks.push_back({g, n * p / parts, n * (p + 1) / parts});
  }
  return tasks;
}

template <class Task>
void run_tasks(const std::vector<GroupTask>& tasks, std::int64_t flops, const Task& task) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool spread =
      threads > 1 && std::int64_t(tasks.size()) >= 2 * threads && flops > kParallelGrain;
  if (!spread) {
    for (const GroupTask& t : tasks)
      task(t);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::size_t i = 0; i < tasks.size(); ++i)
    task(tasks[i]);
}

// bf16 operands are widened to f32 (exact) once, before the tasks, so every product sums in
// f32 as oneDNN's bf16 matmul does; only the order of the sums may differ from it.
void grouped_gemm(const GroupedGemmKey& key, const std::int64_t* offsets, const void* a,
                  const void* b, float* c) {
  const std::int64_t n = key.n, k = key.k, rows_all = offsets[key.groups];
  const float* af = as_f32(a, key.src, rows_all * k, 0);
  const float* bf = as_f32(b, key.src, key.groups * k * n, 1);
  run_tasks(
      group_tasks(offsets, key.groups, n, true), 2 * rows_all * n * k, [&](const GroupTask& t) {
        const std::int64_t r0 = offsets[t.g], rows = offsets[t.g + 1] - r0, w = t.n1 - t.n0;
        float* ct = c + r0 * n + t.n0;
        if (k == 0) {
          for (std::int64_t r = 0; r < rows; ++r)
            std::fill(ct + r * n, ct + r * n + w, 0.f);
          return;
        }
        // B_g is k x n, or n x k stored (tb): columns [n0, n1) of it.
        const float* bg = bf + t.g * k * n;
        tensor::detail::gemm_f32_ld(false, key.tb, rows, w, k, 1.f, af + r0 * k, k,
                                    key.tb ? bg + t.n0 * k : bg + t.n0, key.tb ? k : n, 0.f, ct, n);
      });
}

void grouped_gemm_wgrad(const GroupedGemmKey& key, const std::int64_t* offsets, const void* a,
                        const void* b, float* c) {
  const std::int64_t n = key.n, k = key.k, rows_all = offsets[key.groups];
  const float* af = as_f32(a, key.src, rows_all * k, 0);
  const float* bf = as_f32(b, key.src, rows_all * n, 1);
  run_tasks(group_tasks(offsets, key.groups, n, false), 2 * rows_all * n * k,
            [&](const GroupTask& t) {
              const std::int64_t r0 = offsets[t.g], rows = offsets[t.g + 1] - r0, w = t.n1 - t.n0;
              float* ct = c + t.g * k * n + t.n0;
              if (rows == 0) {
                for (std::int64_t r = 0; r < k; ++r)
                  std::fill(ct + r * n, ct + r * n + w, 0.f);
                return;
              }
              tensor::detail::gemm_f32_ld(true, false, k, w, rows, 1.f, af + r0 * k, k,
                                          bf + r0 * n + t.n0, n, 0.f, ct, n);
            });
}

}  // namespace

const MoeKernels moe_kernels{
    .top_k = top_k,
    .take_columns = take_columns,
    .take_columns_backward = take_columns_backward,
    .dispatch_plan = dispatch_plan,
    .combine = combine,
    .combine_backward = combine_backward,
    .grouped_gemm = grouped_gemm,
    .grouped_gemm_wgrad = grouped_gemm_wgrad,
};

}  // namespace distjax::tensor::detail::cpu
