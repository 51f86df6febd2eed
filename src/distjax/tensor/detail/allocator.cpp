#include "distjax/tensor/detail/allocator.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/cuda_memory.hpp"
#include "distjax/tensor/detail/checked_memory.hpp"

namespace distjax::tensor::detail {
namespace {

// Size classes: 8 per power of two (at most 12.5% slack), so a block freed by one op
// fits the next op that asks for about the same size.
std::size_t size_class(std::size_t nbytes) {
  if (nbytes < kCachedBlockMin) return (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
  const std::size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;
  std::size_t cached = 0;

  void release() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks)
        std::free(p);
    free_blocks.clear();
    cached = 0;
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // leaked on purpose: storage may be freed during static destruction
  return *c;
}

}  // namespace

void* cpu_alloc(std::size_t nbytes) {
  const std::size_t size = size_class(nbytes);
  if (size >= kCachedBlockMin) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= size;
      return p;
    }
  }
  return std::aligned_alloc(64, size);
}

void cpu_free(void* p, std::size_t nbytes) {
  if (!p) return;
  const std::size_t size = size_class(nbytes);
  if (size >= kCachedBlockMin) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + size <= kCacheCapacity) {
      c.free_blocks[size].push_back(p);
      c.cached += size;
      return;
    }
  }
  std::free(p);
}

std::size_t cpu_cached_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.cached;
}

void cpu_release_cached() {
  cache().release();
}

}  // namespace distjax::tensor::detail

// ------------------------------------------------------------ allocators per device kind

namespace distjax::tensor::detail {
namespace {
const DeviceAllocator kCpuAllocator{
    DeviceKind::CPU, [](std::size_t n, int) { return cpu_alloc(n); },
    [](void* p, std::size_t n, int) { cpu_free(p, n); }};
const DeviceAllocator kCheckedAllocator{
    DeviceKind::Checked, [](std::size_t n, int) { return checked::alloc(n); },
    [](void* p, std::size_t n, int) { checked::free(p, n); }};
// tensor/cuda/ (or its stub, which refuses naming the device, in a build without CUDA).
const DeviceAllocator kCudaAllocator{DeviceKind::CUDA, cuda::cuda_alloc, cuda::cuda_free};
}  // namespace

const DeviceAllocator& allocator_for(Device device, const char* op) {
  switch (device.kind) {
    case DeviceKind::CPU: return kCpuAllocator;
    case DeviceKind::Checked: return kCheckedAllocator;
    case DeviceKind::CUDA: return kCudaAllocator;
  }
  DISTJAX_THROW(NotImplemented, "[", op, "] device ", device.str(),
                " has no allocator in this build");
}

}  // namespace distjax::tensor::detail
