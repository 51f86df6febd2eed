// The launch of each backend, one per backend folder (threads/, mpi/ or mpi_stub/, nccl/
// or nccl_stub/), which launch() (launch.cpp) dispatches to.
#pragma once

#include <functional>

namespace distjax::comm {
class Communicator;
struct LaunchOptions;
}  // namespace distjax::comm

namespace distjax::comm::detail {

/// The threads backend (threads/threads_launch.cpp).
void launch_threads(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);
/// The MPI backend (mpi/mpi_launch.cpp, or mpi_stub/, which throws NotImplemented saying
/// why), and whether this build has it.
void launch_mpi(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);
bool mpi_available();
/// The NCCL backend (nccl/nccl_launch.cpp, or nccl_stub/, which throws NotImplemented
/// saying why).
void launch_nccl(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);

}  // namespace distjax::comm::detail
