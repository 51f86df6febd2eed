// Buffer: how the communicator front describes memory to a backend, {pointer, count,
// dtype, device}, so a GPU backend can be added without changing callers.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::comm {

/// Where a buffer lives. A minimal copy of tensor::Device's kind, kept in comm because
/// comm must not depend on tensor. Every backend today moves host memory only.
enum class MemoryKind : std::uint8_t { Host, Cuda };

/// A memory space and index (the host, or CUDA device `index`).
struct BufferDevice {
  MemoryKind kind = MemoryKind::Host;
  int index = 0;
  friend bool operator==(const BufferDevice&, const BufferDevice&) = default;
};

/// `count` elements of `dtype` at `data` on `device`. Inputs of a collective are only
/// read (they are described by the same type; the front casts const away). `count` is
/// the length of this buffer, not of one rank's block: all_gather's recv holds
/// size() x the send count.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::F32;
  BufferDevice device{};

  /// Host memory, as the raw-pointer signatures of Communicator pass it.
  static Buffer host(const void* p, std::int64_t count, DType dtype) {
    return {const_cast<void*>(p), count, dtype, {}};
  }
  std::int64_t bytes() const { return count * static_cast<std::int64_t>(dtype_size(dtype)); }
};

}  // namespace distjax::comm
