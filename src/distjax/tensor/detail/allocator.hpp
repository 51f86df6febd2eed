// Host memory for tensor storage: 64-byte aligned blocks, with a cache of large freed
// blocks so a training step reuses last step's buffers instead of page-faulting fresh
// ones from the OS every time.
#pragma once

#include <cstddef>

#include "distjax/core/device.hpp"

namespace distjax::tensor::detail {

/// Memory of one device kind: what Storage allocates with, and frees with the same one.
struct DeviceAllocator {
  DeviceKind kind;
  /// A 64-byte aligned block of at least `nbytes` on device `index` (nullptr when out of
  /// memory). Thread-safe.
  void* (*alloc)(std::size_t nbytes, int index);
  /// Returns a block from alloc (same nbytes and index). Thread-safe.
  void (*free)(void* p, std::size_t nbytes, int index);
};
/// The allocator of `device`'s kind. In a build without CUDA the CUDA allocator throws
/// NotImplemented naming the device.
const DeviceAllocator& allocator_for(Device device, const char* op);

/// Blocks of at least this many bytes go through the cache; smaller ones straight to malloc.
constexpr std::size_t kCachedBlockMin = 64 * 1024;
/// Upper bound on the bytes the cache keeps in free blocks. Under AddressSanitizer the
/// cache is off, so use-after-free of tensor storage is still reported.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kCacheCapacity = 0;
#else
constexpr std::size_t kCacheCapacity = std::size_t(1) << 30;
#endif

/// A 64-byte aligned block of at least `nbytes` (nullptr when out of memory). Thread-safe.
void* cpu_alloc(std::size_t nbytes);
/// Returns a block from cpu_alloc(nbytes) (same nbytes). Thread-safe.
void cpu_free(void* p, std::size_t nbytes);
/// Bytes currently held in free cached blocks.
std::size_t cpu_cached_bytes();
/// Frees every cached block back to the system.
void cpu_release_cached();

}  // namespace distjax::tensor::detail
