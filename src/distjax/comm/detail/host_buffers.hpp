// Host memory for the backends whose host code moves the buffers (threads, MPI): access to
// a call's buffers, refused on a device the host cannot reach, and an in-place division.
#pragma once

#include <cstdint>

#include "distjax/comm/buffer.hpp"
#include "distjax/core/dtype.hpp"
#include "distjax/tensor/host_access.hpp"

namespace distjax::comm::detail {

/// Host access to one call's buffers (one or two), for a backend whose host code moves
/// them (threads, MPI): constructed before anything of the call happens, it refuses a
/// buffer on a device the host cannot reach (CUDA) with NotImplemented naming the op, the
/// device and `backend`, and holds a tensor::HostAccess on each buffer of the checked
/// device until it is destroyed, once the backend touches the buffers no more (a
/// blocking call's end; a non-blocking one's completion).
class HostBuffers {
 public:
  HostBuffers(const char* op, const char* backend, const Buffer& a);
  HostBuffers(const char* op, const char* backend, const Buffer& a, const Buffer& b);

 private:
  tensor::HostAccess a_, b_;
};

/// In place on host memory: buf[i] /= divisor (Mean after a backend's Sum).
void divide_inplace(void* buf, std::int64_t n, DType dtype, int divisor);

}  // namespace distjax::comm::detail
