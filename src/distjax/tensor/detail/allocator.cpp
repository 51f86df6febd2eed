#include "distjax/tensor/detail/allocator.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
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

// Under an address-space limit (ulimit -v, RLIMIT_AS) the libraries a step calls allocate
// outside this allocator, and not all of them survive a failed mmap: oneDNN 2.6 segfaults
// creating a primitive, a thread cannot get its stack, glibc a new thread's arena. So a
// tensor leaves them a margin: an allocation that would bring the process within
// kAddressMargin (or an eighth of the limit, if smaller) of the limit fails here, and the
// op raises its clean out-of-memory error instead. No limit (the usual case): no check.
constexpr std::size_t kAddressMargin = std::size_t(256) << 20;
constexpr std::size_t kCheckedFrom = std::size_t(64) << 10;  // smaller blocks: not checked

// The limit now (a program may set it after starting), 0 for none.
std::size_t address_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<std::size_t>(r.rlim_cur);
}

// The process's mapped address space now (/proc/self/statm's first field), 0 if unknown.
std::size_t mapped_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long pages = 0;
  const bool read = std::fscanf(f, "%lu", &pages) == 1;
  std::fclose(f);
  return read ? pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

bool leaves_margin(std::size_t size) {
  const std::size_t limit = address_limit();
  if (limit == 0 || size < kCheckedFrom) return true;
  const std::size_t margin = std::min(kAddressMargin, limit / 8);
  return mapped_bytes() + size + margin <= limit;
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
  if (!leaves_margin(size)) return nullptr;
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
