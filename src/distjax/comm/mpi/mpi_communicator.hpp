// The MPI communicator's constructor, for the launch (mpi_launch.cpp).
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <memory>

#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/communicator.hpp"
#include "distjax/comm/launch.hpp"

namespace distjax::comm::mpi {

/// The MPI backend's CommunicatorImpl over `comm` (this process's one device); `op` names
/// the call that creates it in errors.
std::shared_ptr<CommunicatorImpl> make_communicator(MPI_Comm comm, const LaunchOptions& opts,
                                                    std::shared_ptr<CommStats> stats,
                                                    const char* op);

}  // namespace distjax::comm::mpi
