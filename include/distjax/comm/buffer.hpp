// Buffer: how the communicator front describes memory to a backend, {pointer, count,
// dtype, device}, and buffer_of, the one way a tensor becomes one (with its real device).
#pragma once

#include <cstdint>

#include "distjax/core/device.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::tensor {
class Tensor;
}

namespace distjax::comm {

/// `count` elements of `dtype` at `data` on `device`. Inputs of a collective are only
/// read (they are described by the same type; the front casts const away). `count` is
/// the length of this buffer, not of one rank's block: all_gather's recv holds
/// size() x the send count.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::F32;
  Device device{};  ///< where the memory is: a backend refuses a device it cannot reach

  /// CPU memory, as the raw-pointer signatures of Communicator pass it (host arrays such
  /// as a std::vector; a tensor goes through buffer_of).
  static Buffer host(const void* p, std::int64_t count, DType dtype) {
    return {const_cast<void*>(p), count, dtype, {}};
  }
  std::int64_t bytes() const { return count * static_cast<std::int64_t>(dtype_size(dtype)); }
};

/// A tensor's elements as a buffer: its data, numel, dtype and device (a view's own
/// elements). Every caller hands the communicator tensors through this, so a backend sees
/// the memory's real device and refuses one it cannot reach instead of reading it as host
/// memory:
///   comm.all_reduce(buffer_of(g), buffer_of(out), ReduceOp::Sum);
Buffer buffer_of(const tensor::Tensor& t);

}  // namespace distjax::comm
