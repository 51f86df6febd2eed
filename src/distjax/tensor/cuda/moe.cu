// CUDA kernels: Mixture-of-Experts routing (top-k, the dispatch plan, dispatch and combine)
// and the grouped products over experts (cuBLASLt per group, through the GEMM family).
// Every result is deterministic: no atomics, sums in a fixed order.
#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"

namespace distjax::tensor::cuda {
namespace {

constexpr int kMaxTopK = 8;  // the largest k of the ops (tensor/moe.hpp checks it)

// One thread per row: the k best by insertion (larger first; of equal values the lower
// column). Bound: n e floats read once; e is small (tens to hundreds of experts).
__global__ void top_k_kernel(const float* __restrict__ scores, std::int64_t n, std::int64_t e,
                             std::int64_t k, std::int32_t* __restrict__ indices) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float* row = scores + i * e;
    std::int32_t best[kMaxTopK];
    float value[kMaxTopK];
    std::int64_t held = 0;
    for (std::int32_t c = 0; c < e; ++c) {
      const float v = row[c];
      std::int64_t at = held;
      while (at > 0 && value[at - 1] < v) --at;
      if (at >= k) continue;
      for (std::int64_t j = held < k - 1 ? held : k - 1; j > at; --j) {
        best[j] = best[j - 1];
        value[j] = value[j - 1];
      }
      best[at] = c;
      value[at] = v;
      held = held + 1 < k ? held + 1 : k;
    }
    for (std::int64_t j = 0; j < k; ++j) indices[i * k + j] = best[j];
  }
}

void top_k(const float* scores, std::int64_t n, std::int64_t e, std::int64_t k,
           std::int32_t* indices) {
  if (n <= 0) return;
  top_k_kernel<<<grid_for(n), kThreads, 0, thread_stream()>>>(scores, n, e, k, indices);
  DISTJAX_CUDA_LAUNCHED("top_k");
}

__global__ void take_columns_kernel(const float* __restrict__ src,
                                    const std::int32_t* __restrict__ idx, std::int64_t n,
                                    std::int64_t e, std::int64_t k, float* __restrict__ out) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n * k;
       t += stride)
    out[t] = src[(t / k) * e + idx[t]];
}

void take_columns(const float* src, const std::int32_t* idx, std::int64_t n, std::int64_t e,
                  std::int64_t k, float* out) {
  if (n * k <= 0) return;
  take_columns_kernel<<<grid_for(n * k), kThreads, 0, thread_stream()>>>(src, idx, n, e, k, out);
  DISTJAX_CUDA_LAUNCHED("take_columns");
}

// One thread per element of dsrc: the slots that chose its column, added in slot order.
__global__ void take_columns_backward_kernel(const float* __restrict__ g,
                                             const std::int32_t* __restrict__ idx, std::int64_t n,
                                             std::int64_t e, std::int64_t k,
                                             float* __restrict__ dsrc) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n * e;
       t += stride) {
    const std::int64_t i = t / e, c = t - i * e;
    float sum = 0.f;
    for (std::int64_t j = 0; j < k; ++j)
      if (idx[i * k + j] == c) sum += g[i * k + j];
    dsrc[t] = sum;
  }
}

void take_columns_backward(const float* g, const std::int32_t* idx, std::int64_t n,
                           std::int64_t e, std::int64_t k, float* dsrc) {
  if (n * e <= 0) return;
  take_columns_backward_kernel<<<grid_for(n * e), kThreads, 0, thread_stream()>>>(g, idx, n, e, k,
                                                                                  dsrc);
  DISTJAX_CUDA_LAUNCHED("take_columns_backward");
}

// ------------------------------------------------------------------ the dispatch plan
// In steps, each a kernel on the thread's stream (pairs = n k):
//   1. per expert (a block each), over all pairs in token order: each of its pairs' rank
//      among them (into position) and their number (all[g]);
//   2. one thread: start[g], the exclusive prefix sum of all[];
//   3. per pair: order[start[g] + rank] = the pair (each expert's pairs, in token order);
//   4. per pair: whether it is kept (its rank below the capacity; with a priority, fewer
//      than `capacity` pairs of its expert rank above it);
//   5. per expert: the kept pairs' rank among them (the scan of 1 over the expert's list),
//      counts[g], and -1 for a dropped pair;
//   6. one thread: offsets of counts; per pair: position += its expert's offset.
// Step 4 with a priority costs each pair a pass over its expert's pairs: sum over experts
// of all[g]^2 comparisons.

constexpr int kScanThreads = 256;
using BlockScan = cub::BlockScan<std::int32_t, kScanThreads>;

__global__ void plan_rank_kernel(const std::int32_t* __restrict__ experts, std::int64_t pairs,
                                 std::int32_t* __restrict__ rank, std::int32_t* __restrict__ all) {
  __shared__ typename BlockScan::TempStorage scan;
  const std::int32_t g = blockIdx.x;
  std::int32_t base = 0;
  for (std::int64_t first = 0; first < pairs; first += kScanThreads) {
    const std::int64_t i = first + threadIdx.x;
    const std::int32_t flag = i < pairs && experts[i] == g ? 1 : 0;
    std::int32_t before = 0, total = 0;
    BlockScan(scan).ExclusiveSum(flag, before, total);
    if (flag) rank[i] = base + before;
    base += total;
    __syncthreads();  // the temporary storage is reused by the next chunk
  }
  if (threadIdx.x == 0) all[g] = base;
}

__global__ void exclusive_prefix_kernel(const std::int32_t* __restrict__ in, std::int64_t e,
                                        std::int32_t* __restrict__ out) {
  std::int32_t sum = 0;
  for (std::int64_t g = 0; g < e; ++g) {
    out[g] = sum;
    sum += in[g];
  }
}

__global__ void plan_order_kernel(const std::int32_t* __restrict__ experts,
                                  const std::int32_t* __restrict__ rank,
                                  const std::int32_t* __restrict__ start, std::int64_t pairs,
                                  std::int32_t* __restrict__ order) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += stride)
    order[start[experts[i]] + rank[i]] = static_cast<std::int32_t>(i);
}

__global__ void plan_keep_kernel(const std::int32_t* __restrict__ experts,
                                 const float* __restrict__ priority,
                                 const std::int32_t* __restrict__ rank,
                                 const std::int32_t* __restrict__ start,
                                 const std::int32_t* __restrict__ all,
                                 const std::int32_t* __restrict__ order, std::int64_t pairs,
                                 std::int64_t capacity, std::int32_t* __restrict__ keep) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += stride) {
    const std::int32_t g = experts[i];
    if (capacity < 0 || all[g] <= capacity) {
      keep[i] = 1;
    } else if (priority == nullptr) {
      keep[i] = rank[i] < capacity ? 1 : 0;
    } else {
      const float p = priority[i];
      std::int64_t above = 0;
      for (std::int32_t j = start[g], end = start[g] + all[g]; j < end; ++j) {
        const std::int32_t other = order[j];
        const float q = priority[other];
        above += (q > p || (q == p && other < i)) ? 1 : 0;
      }
      keep[i] = above < capacity ? 1 : 0;
    }
  }
}

__global__ void plan_kept_rank_kernel(const std::int32_t* __restrict__ order,
                                      const std::int32_t* __restrict__ start,
                                      const std::int32_t* __restrict__ all,
                                      const std::int32_t* __restrict__ keep,
                                      std::int32_t* __restrict__ position,
                                      std::int32_t* __restrict__ counts) {
  __shared__ typename BlockScan::TempStorage scan;
  const std::int32_t g = blockIdx.x;
  std::int32_t base = 0;
  for (std::int32_t first = 0; first < all[g]; first += kScanThreads) {
    const std::int32_t j = first + threadIdx.x;
    const std::int32_t pair = j < all[g] ? order[start[g] + j] : -1;
    const std::int32_t flag = pair >= 0 ? keep[pair] : 0;
    std::int32_t before = 0, total = 0;
    BlockScan(scan).ExclusiveSum(flag, before, total);
    if (pair >= 0) position[pair] = flag ? base + before : -1;
    base += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[g] = base;
}

__global__ void plan_offset_kernel(const std::int32_t* __restrict__ experts,
                                   const std::int32_t* __restrict__ offsets, std::int64_t pairs,
                                   std::int32_t* __restrict__ position) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += stride)
    if (position[i] >= 0) position[i] += offsets[experts[i]];
}

void dispatch_plan(const std::int32_t* experts, const float* priority, std::int64_t n,
                   std::int64_t k, std::int64_t e, std::int64_t capacity,
                   std::int32_t* position, std::int32_t* counts) {
  const std::int64_t pairs = n * k;
  const cudaStream_t stream = thread_stream();
  if (pairs == 0) {
    DISTJAX_CUDA_CHECK(cudaMemsetAsync(counts, 0, e * sizeof(std::int32_t), stream),
                       "dispatch_plan");
    return;
  }
  StreamScratch scratch((3 * e + 2 * pairs) * sizeof(std::int32_t), stream, "dispatch_plan");
  std::int32_t* all = scratch.as<std::int32_t>();
  std::int32_t* start = all + e;
  std::int32_t* offsets = start + e;
  std::int32_t* order = offsets + e;
  std::int32_t* keep = order + pairs;
  const auto blocks = static_cast<unsigned>(e);
  plan_rank_kernel<<<blocks, kScanThreads, 0, stream>>>(experts, pairs, position, all);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  exclusive_prefix_kernel<<<1, 1, 0, stream>>>(all, e, start);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  plan_order_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(experts, position, start, pairs,
                                                              order);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  plan_keep_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(experts, priority, position, start,
                                                             all, order, pairs, capacity, keep);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  plan_kept_rank_kernel<<<blocks, kScanThreads, 0, stream>>>(order, start, all, keep, position,
                                                             counts);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  exclusive_prefix_kernel<<<1, 1, 0, stream>>>(counts, e, offsets);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  plan_offset_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(experts, offsets, pairs, position);
  DISTJAX_CUDA_LAUNCHED("dispatch_plan");
  scratch.release();
}

// ------------------------------------------------------------------ dispatch and combine

// One thread per output element: its token's kept slots in slot order. Bound: n d floats
// written, n k d read (the rows of the expert order).
__global__ void combine_kernel(const float* __restrict__ src, const std::int32_t* __restrict__ position,
                               const float* __restrict__ gates, std::int64_t n, std::int64_t k,
                               std::int64_t d, float* __restrict__ y) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n * d;
       t += stride) {
    const std::int64_t i = t / d, c = t - i * d;
    float sum = 0.f;
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int32_t p = position[i * k + s];
      if (p < 0) continue;
      const float v = src[std::int64_t(p) * d + c];
      sum = gates ? fmaf(gates[i * k + s], v, sum) : sum + v;
    }
    y[t] = sum;
  }
}

void combine(const float* src, const std::int32_t* position, const float* gates, std::int64_t n,
             std::int64_t k, std::int64_t d, float* y) {
  if (n * d <= 0) return;
  combine_kernel<<<grid_for(n * d), kThreads, 0, thread_stream()>>>(src, position, gates, n, k, d,
                                                                    y);
  DISTJAX_CUDA_LAUNCHED("combine");
}

// One thread per element of a kept pair's row: dst[p] = gate * g[t].
__global__ void scatter_rows_kernel(const float* __restrict__ g,
                                    const std::int32_t* __restrict__ position,
                                    const float* __restrict__ gates, std::int64_t n,
                                    std::int64_t k, std::int64_t d, float* __restrict__ dst) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n * k * d;
       t += stride) {
    const std::int64_t pair = t / d, c = t - pair * d;
    const std::int32_t p = position[pair];
    if (p < 0) continue;
    const float v = g[(pair / k) * d + c];
    dst[std::int64_t(p) * d + c] = gates ? gates[pair] * v : v;
  }
}

// One warp per pair: the dot product of g[t] and src[p], lanes striding over d, then a
// fixed tree over the lanes.
__global__ void gate_grad_kernel(const float* __restrict__ g, const float* __restrict__ src,
                                 const std::int32_t* __restrict__ position, std::int64_t n,
                                 std::int64_t k, std::int64_t d, float* __restrict__ dgates) {
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (std::int64_t pair = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       pair < n * k; pair += warps) {
    const std::int32_t p = position[pair];
    float sum = 0.f;
    if (p >= 0) {
      const float* gt = g + (pair / k) * d;
      const float* row = src + std::int64_t(p) * d;
      for (std::int64_t c = lane; c < d; c += 32) sum = fmaf(gt[c], row[c], sum);
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) dgates[pair] = sum;
  }
}

void combine_backward(const float* g, const float* src, const std::int32_t* position,
                      const float* gates, std::int64_t n, std::int64_t k, std::int64_t d,
                      float* dst, float* dgates) {
  if (n * k <= 0) return;
  const cudaStream_t stream = thread_stream();
  if (d > 0) {
    scatter_rows_kernel<<<grid_for(n * k * d), kThreads, 0, stream>>>(g, position, gates, n, k, d,
                                                                      dst);
    DISTJAX_CUDA_LAUNCHED("combine_backward");
  }
  if (dgates) {
    gate_grad_kernel<<<grid_for(n * k * 32), kThreads, 0, stream>>>(g, src, position, n, k, d,
                                                                   dgates);
    DISTJAX_CUDA_LAUNCHED("combine_backward");
  }
}

// ------------------------------------------------------------------ grouped products
// One cuBLASLt product per group with rows (the GEMM family's `gemm`, its plans cached per
// problem, so per group size met): the offsets are on the host, so nothing waits.

std::size_t element_bytes(DType dtype) {
  return dtype == DType::F32 ? 4 : 2;
}

void grouped_gemm(const detail::GroupedGemmKey& key, const std::int64_t* offsets, const void* a,
                  const void* b, float* c) {
  const std::size_t es = element_bytes(key.src);
  for (std::int64_t g = 0; g < key.groups; ++g) {
    const std::int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
    if (rows == 0) continue;
    const detail::GemmKey gk{.batch = 1, .m = rows, .n = key.n, .k = key.k, .ta = false,
                             .tb = key.tb, .b_shared = true, .bias = false, .src = key.src,
                             .dst = DType::F32};
    gemm_kernels.gemm(gk, static_cast<const char*>(a) + r0 * key.k * es,
                      static_cast<const char*>(b) + g * key.k * key.n * es, nullptr, nullptr,
                      c + r0 * key.n, nullptr);
  }
}

void grouped_gemm_wgrad(const detail::GroupedGemmKey& key, const std::int64_t* offsets,
                        const void* a, const void* b, float* c) {
  const std::size_t es = element_bytes(key.src);
  for (std::int64_t g = 0; g < key.groups; ++g) {
    const std::int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
    float* cg = c + g * key.k * key.n;
    if (rows == 0) {
      DISTJAX_CUDA_CHECK(cudaMemsetAsync(cg, 0, key.k * key.n * sizeof(float), thread_stream()),
                         "grouped_gemm_wgrad");
      continue;
    }
    const detail::GemmKey gk{.batch = 1, .m = key.k, .n = key.n, .k = rows, .ta = true,
                             .tb = false, .b_shared = true, .bias = false, .src = key.src,
                             .dst = DType::F32};
    gemm_kernels.gemm(gk, static_cast<const char*>(a) + r0 * key.k * es,
                      static_cast<const char*>(b) + r0 * key.n * es, nullptr, nullptr, cg, nullptr);
  }
}

}  // namespace

const detail::MoeKernels moe_kernels{
    .top_k = top_k,
    .take_columns = take_columns,
    .take_columns_backward = take_columns_backward,
    .dispatch_plan = dispatch_plan,
    .combine = combine,
    .combine_backward = combine_backward,
    .grouped_gemm = grouped_gemm,
    .grouped_gemm_wgrad = grouped_gemm_wgrad,
};

}  // namespace distjax::tensor::cuda
