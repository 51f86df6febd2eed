// What this build has of NCCL. The NCCL communicator itself (one GPU per device, NCCL
// collectives) is not written yet: this is the seam it will grow from, compiled against
// nccl.h in builds with CUDA and NCCL (comm/nccl/), a stub otherwise (comm/nccl_stub/).
#pragma once

#include <string>

namespace distjax::comm::detail {

/// True when this build links NCCL (CUDA on, nccl.h and libnccl found at configure time).
bool built_with_nccl();

/// The version of the NCCL library loaded at run time, "2.28.3" (ncclGetVersion; it needs
/// no GPU), or "" in a build without NCCL. Throws CommError when NCCL refuses to answer.
std::string nccl_version();

}  // namespace distjax::comm::detail
