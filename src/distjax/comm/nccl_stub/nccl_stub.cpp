// Stub of the NCCL seam for builds without NCCL (no CUDA, or nccl.h / libnccl not found).
#include "distjax/comm/nccl/nccl_api.hpp"

#include "distjax/comm/detail/backends.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

bool built_with_nccl() {
  return false;
}
std::string nccl_version() {
  return "";
}

void launch_nccl(const LaunchOptions&, const std::function<void(Communicator&)>&) {
  DISTJAX_THROW(NotImplemented,
                "[launch] backend nccl: this build has no NCCL: it needs the CUDA backend and "
                "nccl.h / libnccl at configure time (DISTJAX_WITH_CUDA, NCCL_HOME; see "
                "docs/nccl.md)");
}

}  // namespace distjax::comm::detail
