// HostAccess: lets host code outside the kernel table (a communication backend's copies
// and reductions, which run on the host) touch a device's memory for a scope.
#pragma once

#include <cstddef>
#include <memory>

#include "distjax/core/device.hpp"

namespace distjax::tensor {

/// For its lifetime, host code may read and write `nbytes` at `p` on `device`: nothing to
/// do on the CPU; the checked device opens the memory; a device the host cannot reach
/// (CUDA) throws NotImplemented naming `op` and the device.
class HostAccess {
 public:
  HostAccess(const char* op, Device device, const void* p, std::size_t nbytes);
  ~HostAccess();
  HostAccess(HostAccess&&) noexcept;
  HostAccess& operator=(HostAccess&&) noexcept;
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;

 private:
  const void* opened_ = nullptr;  // a checked block held open, or null
};

/// Whether host code can reach memory of `device` through a HostAccess.
bool host_reachable(Device device);

}  // namespace distjax::tensor
