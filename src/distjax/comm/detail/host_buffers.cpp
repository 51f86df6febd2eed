// Host access to a call's buffers, and the in-place division of a mean (see
// host_buffers.hpp).
#include "distjax/comm/detail/host_buffers.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::detail {

namespace {
tensor::HostAccess host_access(const char* op, const char* backend, const Buffer& b) {
  DISTJAX_CHECK(tensor::host_reachable(b.device), NotImplemented, "[", op, "] buffers on ",
                b.device.str(), " are out of reach of the ", backend,
                " backend, which moves memory the host reaches (cpu, checked)");
  return tensor::HostAccess(op, b.device, b.data, static_cast<std::size_t>(b.bytes()));
}
}  // namespace

HostBuffers::HostBuffers(const char* op, const char* backend, const Buffer& a)
    : a_(host_access(op, backend, a)), b_(op, Device::cpu(), nullptr, 0) {}

HostBuffers::HostBuffers(const char* op, const char* backend, const Buffer& a, const Buffer& b)
    : a_(host_access(op, backend, a)), b_(host_access(op, backend, b)) {}

void divide_inplace(void* buf, std::int64_t n, DType dtype, int divisor) {
  const void* srcs[1] = {buf};
  tensor::raw::reduce("divide", Device::cpu(), buf, srcs, 1, n, dtype, tensor::raw::Reduction::Mean,
                      divisor);
}

}  // namespace distjax::comm::detail
