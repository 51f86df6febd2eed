// Buffer: how the communicator front describes memory to a backend, {pointer, count,
// dtype, device}, so a GPU backend can be added without changing callers.
#pragma once

#include <cstdint>

#include "distjax/core/device.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm {

/// `count` elements of `dtype` at `data` on `device`. Inputs of a collective are only
/// read (they are described by the same type; the front casts const away). `count` is
/// the length of this buffer, not of one rank's block: all_gather's recv holds
/// size() x the send count.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::F32;
  Device device{};  ///< every backend today moves CPU memory only

  /// CPU memory, as the raw-pointer signatures of Communicator pass it.
  static Buffer host(const void* p, std::int64_t count, DType dtype) {
    return {const_cast<void*>(p), count, dtype, {}};
  }
  std::int64_t bytes() const { return count * static_cast<std::int64_t>(dtype_size(dtype)); }
};

}  // namespace distjax::comm
