// The NCCL backend's communicator (private to src/distjax/comm/nccl): one GPU per process,
// NCCL collectives on a communication stream ordered against the caller's compute stream
// by events, point-to-point transfers grouped, timeouts that abort the NCCL communicator.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <vector>

#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/communicator.hpp"

namespace distjax::comm::nccl {

/// What every communicator of one launch shares.
struct NcclSettings {
  int device = 0;  ///< this process's CUDA device
  std::chrono::milliseconds timeout{30000};
  bool half_reduce_in_f32 = true;  ///< LaunchOptions::half_reduce_in_f32
};

/// Makes `config` the NCCL configuration of every communicator of this backend:
/// non-blocking (blocking = 0), so that creation, split and group ends return at once
/// (ncclInProgress) and are polled against the timeout instead of blocking the host.
void nccl_config(ncclConfig_t& config);

/// Waits until `comm` has finished the call that returned `r` (ncclInProgress on a
/// non-blocking communicator): polls ncclCommGetAsyncError until `deadline`. Throws
/// CommError naming `op`, `call` and the device on an error or at the deadline; the
/// caller then aborts `comm` (ncclCommAbort).
void nccl_settle(ncclComm_t comm, ncclResult_t r, const char* op, const char* call, int device,
                 std::chrono::steady_clock::time_point deadline);

/// The backend's CommunicatorImpl over `comm` (owned: destroyed with the last handle),
/// whose members are the world ranks `members` (this process is group rank `rank`).
/// `host` (may be invalid) is a host communicator over the same members: the timeout's
/// diagnosis exchanges the flight records over it.
std::shared_ptr<CommunicatorImpl> make_communicator(ncclComm_t comm, int rank,
                                                    std::vector<int> members, Communicator host,
                                                    const NcclSettings& settings,
                                                    std::shared_ptr<CommStats> stats);

}  // namespace distjax::comm::nccl
