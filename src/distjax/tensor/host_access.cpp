#include "distjax/tensor/host_access.hpp"

#include <utility>

#include "distjax/core/error.hpp"
#include "distjax/tensor/detail/checked_memory.hpp"

namespace distjax::tensor {

bool host_reachable(Device device) { return device.kind != DeviceKind::CUDA; }

HostAccess::HostAccess(const char* op, Device device, const void* p, std::size_t nbytes) {
  DISTJAX_CHECK(host_reachable(device), NotImplemented, "[", op, "] cannot reach memory on ",
                device.str(), " from the host");
  if (device.kind == DeviceKind::Checked && nbytes > 0) {
    detail::checked::open(p);
    opened_ = p;
  }
}

HostAccess::~HostAccess() {
  if (opened_) detail::checked::close(opened_);
}

HostAccess::HostAccess(HostAccess&& o) noexcept : opened_(std::exchange(o.opened_, nullptr)) {}

HostAccess& HostAccess::operator=(HostAccess&& o) noexcept {
  if (this != &o) {
    if (opened_) detail::checked::close(opened_);
    opened_ = std::exchange(o.opened_, nullptr);
  }
  return *this;
}

}  // namespace distjax::tensor
