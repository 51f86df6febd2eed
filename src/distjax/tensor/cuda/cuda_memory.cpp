// Device memory of the CUDA backend (see cuda_memory.hpp): the runtime's stream-ordered
// allocator (cudaMallocAsync) on each device's default memory pool, told to keep what is
// freed (release threshold: everything), so that blocks are reused in stream order and a
// training step makes no cudaMalloc/cudaFree. DISTJAX_CUDA_POISON=1 fills every new block
// with 0xFF bytes (NaN in f32), so that a kernel which leaves an output element unwritten
// shows as a NaN (the op harness sets it).
#include "distjax/tensor/cuda/cuda_memory.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda_runtime.hpp"

namespace distjax::tensor {
namespace cuda {
namespace {

// The device's default pool, set up once per device to keep freed memory. Every allocation
// asks: the set-up pool is read without a lock.
cudaMemPool_t pool_of(int device) {
  static std::mutex mu;
  static std::atomic<cudaMemPool_t> pools[64] = {};
  DISTJAX_CHECK(device < 64, InvalidArgument, "[cuda_alloc] cuda:", device, " is out of range");
  if (cudaMemPool_t pool = pools[device].load(std::memory_order_acquire)) return pool;
  std::lock_guard<std::mutex> lock(mu);
  if (cudaMemPool_t pool = pools[device].load(std::memory_order_relaxed)) return pool;
  cudaMemPool_t pool = nullptr;
  DISTJAX_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device), "cuda_alloc");
  std::uint64_t keep_all = UINT64_MAX;
  DISTJAX_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
                     "cuda_alloc");
  pools[device].store(pool, std::memory_order_release);
  return pool;
}

bool poison() {
  static const bool on = [] {
    const char* env = std::getenv("DISTJAX_CUDA_POISON");
    return env && std::strcmp(env, "1") == 0;
  }();
  return on;
}

}  // namespace

void* cuda_alloc(std::size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  DeviceGuard guard(device, "cuda_alloc");
  void* p = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocFromPoolAsync(&p, nbytes, pool_of(device), cudaStreamPerThread),
                     "cuda_alloc", nbytes, " bytes");
  if (poison())
    DISTJAX_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, nbytes, cudaStreamPerThread), "cuda_alloc");
  return p;
}

void cuda_free(void* p, std::size_t nbytes, int device) {
  if (p == nullptr) return;
  DeviceGuard guard(device, "cuda_free");
  DISTJAX_CUDA_CHECK(cudaFreeAsync(p, cudaStreamPerThread), "cuda_free", nbytes, " bytes");
}

}  // namespace cuda

CudaMemoryStats cuda_memory_stats(int device) {
  if (cuda_device_count() <= device) return {};
  cudaMemPool_t pool = cuda::pool_of(device);
  std::uint64_t reserved = 0, peak = 0;
  DISTJAX_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
                     "cuda_memory_stats");
  DISTJAX_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &peak),
                     "cuda_memory_stats");
  return {static_cast<std::int64_t>(reserved), static_cast<std::int64_t>(peak)};
}

}  // namespace distjax::tensor
