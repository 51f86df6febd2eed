// What this build has of NCCL: whether it is linked and its version, compiled against
// nccl.h in builds with CUDA and NCCL (comm/nccl/), a stub otherwise (comm/nccl_stub/). The
// communicator itself is nccl_communicator.hpp; its launch is detail::launch_nccl.
#pragma once

#include <string>

namespace distjax::comm::detail {

/// True when this build links NCCL (CUDA on, nccl.h and libnccl found at configure time).
bool built_with_nccl();

/// The version of the NCCL library loaded at run time, "2.28.3" (ncclGetVersion; it needs
/// no GPU), or "" in a build without NCCL. Throws CommError when NCCL refuses to answer.
std::string nccl_version();

}  // namespace distjax::comm::detail
