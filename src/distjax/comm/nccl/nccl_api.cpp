// NCCL as linked into this build (see nccl_api.hpp).
#include "distjax/comm/nccl/nccl_api.hpp"

#include <nccl.h>

#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

bool built_with_nccl() {
  return true;
}

std::string nccl_version() {
  int code = 0;
  const ncclResult_t r = ncclGetVersion(&code);
  DISTJAX_CHECK(r == ncclSuccess, CommError,
                "[nccl_version] ncclGetVersion failed: ", ncclGetErrorString(r));
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

}  // namespace distjax::comm::detail
