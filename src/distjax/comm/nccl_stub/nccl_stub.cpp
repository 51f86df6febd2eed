// Stub of the NCCL seam for builds without NCCL (no CUDA, or nccl.h / libnccl not found).
#include "distjax/comm/nccl/nccl_api.hpp"

namespace distjax::comm::detail {

bool built_with_nccl() {
  return false;
}
std::string nccl_version() {
  return "";
}

}  // namespace distjax::comm::detail
