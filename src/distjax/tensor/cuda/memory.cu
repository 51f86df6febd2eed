// CUDA communication kernels (table/comm.hpp): the rank-order reduction of several
// simulated devices' blocks on one GPU (the CPU's bits: each element folded left in source
// order, halves in f32 and rounded once), zero fills, stream waits and events, and
// page-locked host blocks for staging, kept for reuse.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::RankReduce;

// The sources and the destinations, by value in the kernel's parameters (512 bytes each).
struct Sources {
  const void* p[detail::kMaxRankSources];
};
struct Dests {
  void* p[detail::kMaxRankSources];
};

// What each element accumulates in: f32 for halves, the type itself otherwise.
template <class T>
using Acc = std::conditional_t<kHalf<T>, float, T>;

template <class T>
__device__ inline Acc<T> widen(T v) {
  if constexpr (kHalf<T>)
    return f32_from_half(v);
  else
    return v;
}

template <class T, RankReduce Op>
__device__ inline T fold(const Sources& s, int k, std::int64_t i, Acc<T> divisor) {
  using A = Acc<T>;
  A acc = widen(static_cast<const T*>(s.p[0])[i]);
  for (int j = 1; j < k; ++j) {
    const A v = widen(static_cast<const T*>(s.p[j])[i]);
    if constexpr (Op == RankReduce::Max)
      acc = v > acc ? v : acc;
    else
      acc = acc + v;  // a plain add: no contraction with the division below
  }
  if constexpr (Op == RankReduce::Mean) acc = acc / divisor;
  if constexpr (kHalf<T>)
    return half_from_f32<T>(acc);
  else
    return acc;
}

// Each element is read from every source before it is written to any destination, so a
// destination may alias a source at the same offset.
template <class T, RankReduce Op>
__global__ void reduce_kernel(Dests d, int m, Sources s, int k, std::int64_t n, Acc<T> divisor) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T v = fold<T, Op>(s, k, i, divisor);
    for (int j = 0; j < m; ++j)
      static_cast<T*>(d.p[j])[i] = v;
  }
}

// f32 with every pointer 16-byte aligned: four elements per load (the same arithmetic).
template <RankReduce Op>
__global__ void reduce_f32x4_kernel(Dests d, int m, Sources s, int k, std::int64_t n4,
                                    float divisor) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 acc = static_cast<const float4*>(s.p[0])[i];
    for (int j = 1; j < k; ++j) {
      const float4 v = static_cast<const float4*>(s.p[j])[i];
      if constexpr (Op == RankReduce::Max) {
        acc.x = v.x > acc.x ? v.x : acc.x;
        acc.y = v.y > acc.y ? v.y : acc.y;
        acc.z = v.z > acc.z ? v.z : acc.z;
        acc.w = v.w > acc.w ? v.w : acc.w;
      } else {
        acc.x = __fadd_rn(acc.x, v.x);
        acc.y = __fadd_rn(acc.y, v.y);
        acc.z = __fadd_rn(acc.z, v.z);
        acc.w = __fadd_rn(acc.w, v.w);
      }
    }
    if constexpr (Op == RankReduce::Mean) {
      acc.x = __fdiv_rn(acc.x, divisor);
      acc.y = __fdiv_rn(acc.y, divisor);
      acc.z = __fdiv_rn(acc.z, divisor);
      acc.w = __fdiv_rn(acc.w, divisor);
    }
    for (int j = 0; j < m; ++j)
      static_cast<float4*>(d.p[j])[i] = acc;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

template <class T, RankReduce Op>
void launch_reduce(const Dests& d, int m, const Sources& s, int k, std::int64_t n, int divisor,
                   cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    bool aligned = n % 4 == 0;
    for (int j = 0; j < m; ++j)
      aligned &= aligned16(d.p[j]);
    for (int j = 0; j < k; ++j)
      aligned &= aligned16(s.p[j]);
    if (aligned) {
      reduce_f32x4_kernel<Op><<<grid_for(n / 4), kThreads, 0, stream>>>(
          d, m, s, k, n / 4, static_cast<float>(divisor));
      DISTJAX_CUDA_LAUNCHED("reduce_ranks");
      return;
    }
  }
  reduce_kernel<T, Op>
      <<<grid_for(n), kThreads, 0, stream>>>(d, m, s, k, n, static_cast<Acc<T>>(divisor));
  DISTJAX_CUDA_LAUNCHED("reduce_ranks");
}

template <class T>
void reduce_typed(const Dests& d, int m, const Sources& s, int k, std::int64_t n, RankReduce op,
                  int divisor, cudaStream_t stream) {
  switch (op) {
    case RankReduce::Sum:
      return launch_reduce<T, RankReduce::Sum>(d, m, s, k, n, divisor, stream);
    case RankReduce::Mean:
      return launch_reduce<T, RankReduce::Mean>(d, m, s, k, n, divisor, stream);
    case RankReduce::Max:
      return launch_reduce<T, RankReduce::Max>(d, m, s, k, n, divisor, stream);
  }
}

void reduce_ranks(void* const* dsts, int m, const void* const* srcs, int k, std::int64_t n,
                  DType dtype, RankReduce op, int divisor) {
  DISTJAX_CHECK(m >= 1 && m <= detail::kMaxRankSources && k >= 1 && k <= detail::kMaxRankSources,
                InvalidArgument, "[reduce_ranks] folds 1 to ", detail::kMaxRankSources,
                " sources into as many destinations, got ", k, " into ", m);
  if (n == 0) return;
  Sources s{};
  for (int j = 0; j < k; ++j)
    s.p[j] = srcs[j];
  Dests d{};
  for (int j = 0; j < m; ++j)
    d.p[j] = dsts[j];
  const cudaStream_t stream = thread_stream();
  switch (dtype) {
    case DType::F32:
      return reduce_typed<float>(d, m, s, k, n, op, divisor, stream);
    case DType::F64:
      return reduce_typed<double>(d, m, s, k, n, op, divisor, stream);
    case DType::I32:
      return reduce_typed<std::int32_t>(d, m, s, k, n, op, divisor, stream);
    case DType::I64:
      return reduce_typed<std::int64_t>(d, m, s, k, n, op, divisor, stream);
    case DType::BF16:
      return reduce_typed<Bf16>(d, m, s, k, n, op, divisor, stream);
    case DType::F16:
      return reduce_typed<F16>(d, m, s, k, n, op, divisor, stream);
  }
}

void zero(void* dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  DISTJAX_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, thread_stream()), "zero", nbytes, " bytes");
}

void synchronize() {
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(thread_stream()), "synchronize");
}

// Events are kept for reuse, never destroyed. A stream told to wait for an event (another
// simulated device's, say) may reach that wait on the GPU long after the host dropped the
// event: with several processes time-slicing one GPU the GPU runs far behind the host. CUDA
// lets an event be re-recorded once a wait has been queued (the wait keeps the record it was
// queued after), but says nothing of destroying it before the wait has run; doing so is what
// this pool avoids. It also spares the driver's event creation and destruction (a
// context-wide lock) at every collective. Each event is kept with the device it was made on.
struct PooledEvent {
  cudaEvent_t event = nullptr;
  int device = 0;
};
struct EventPool {
  std::mutex mu;
  std::vector<PooledEvent*> free;
};
EventPool& event_pool() {
  static auto* pool = new EventPool;  // never destroyed: events may be in use at exit
  return *pool;
}
PooledEvent* take_event() {
  int device = 0;
  DISTJAX_CUDA_CHECK(cudaGetDevice(&device), "event_record");
  {
    EventPool& pool = event_pool();
    std::lock_guard lk(pool.mu);
    for (std::size_t i = pool.free.size(); i-- > 0;) {
      if (pool.free[i]->device != device) continue;
      PooledEvent* e = pool.free[i];
      pool.free.erase(pool.free.begin() + static_cast<std::ptrdiff_t>(i));
      return e;
    }
  }
  auto* e = new PooledEvent{nullptr, device};
  const cudaError_t err = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    delete e;
    DISTJAX_CUDA_CHECK(err, "event_record");
  }
  return e;
}
PooledEvent* pooled(void* event) {
  return static_cast<PooledEvent*>(event);
}

void event_release(void* event) {
  if (!event) return;
  EventPool& pool = event_pool();
  std::lock_guard lk(pool.mu);
  pool.free.push_back(pooled(event));
}

void* event_record() {
  PooledEvent* e = take_event();
  const cudaError_t err = cudaEventRecord(e->event, thread_stream());
  if (err != cudaSuccess) {
    event_release(e);
    DISTJAX_CUDA_CHECK(err, "event_record");
  }
  return e;
}

void event_wait(void* event) {
  if (!event) return;
  const cudaError_t err = cudaEventSynchronize(pooled(event)->event);
  event_release(event);
  DISTJAX_CUDA_CHECK(err, "event_wait");
}

bool event_done(void* event) {
  if (!event) return true;
  const cudaError_t err = cudaEventQuery(pooled(event)->event);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is no error: leave none behind
    return false;
  }
  DISTJAX_CUDA_CHECK(err, "event_done");
  return true;
}

void event_stream_wait(void* event) {
  if (event)
    DISTJAX_CUDA_CHECK(cudaStreamWaitEvent(thread_stream(), pooled(event)->event, 0),
                       "event_stream_wait");
}

// Into page-locked memory a device-to-host copy is a DMA queued on the stream.
void to_host_async(const void* src, void* host_dst, std::size_t nbytes) {
  if (nbytes > 0)
    DISTJAX_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, thread_stream()),
        "to_host_async", nbytes, " bytes");
}

// Page-locked blocks cost a system call and a page-table walk each: freed ones are kept
// by size class (powers of two from 64 KiB) and handed out again.
struct PinnedCache {
  std::mutex mu;
  std::multimap<std::size_t, void*> free;
};
PinnedCache& pinned_cache() {
  static auto* cache = new PinnedCache;  // never destroyed: blocks may be freed at exit
  return *cache;
}
std::size_t size_class(std::size_t nbytes) {
  std::size_t c = std::size_t(64) << 10;
  while (c < nbytes)
    c <<= 1;
  return c;
}

void* host_alloc(std::size_t nbytes) {
  const std::size_t c = size_class(nbytes);
  {
    PinnedCache& cache = pinned_cache();
    std::lock_guard lk(cache.mu);
    auto it = cache.free.find(c);
    if (it != cache.free.end()) {
      void* p = it->second;
      cache.free.erase(it);
      return p;
    }
  }
  void* p = nullptr;
  DISTJAX_CUDA_CHECK(cudaHostAlloc(&p, c, cudaHostAllocPortable), "host_alloc", c,
                     " bytes of page-locked host memory");
  return p;
}

void host_free(void* p, std::size_t nbytes) {
  if (!p) return;
  PinnedCache& cache = pinned_cache();
  std::lock_guard lk(cache.mu);
  cache.free.emplace(size_class(nbytes), p);
}

}  // namespace

const detail::MemoryKernels memory_kernels{
    .zero = zero,
    .reduce_ranks = reduce_ranks,
    .synchronize = synchronize,
    .event_record = event_record,
    .event_wait = event_wait,
    .event_done = event_done,
    .event_stream_wait = event_stream_wait,
    .event_release = event_release,
    .to_host_async = to_host_async,
    .host_alloc = host_alloc,
    .host_free = host_free,
};

}  // namespace distjax::tensor::cuda
