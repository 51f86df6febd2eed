// Stub of the MPI backend for builds without MPI: says clearly that it is missing.
#include <string>
#include <vector>

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

void launch_mpi(const LaunchOptions&, const std::function<void(Communicator&)>&) {
  DISTJAX_THROW(NotImplemented,
                "[launch] the MPI backend is not compiled into this build of DistJax: install "
                "an MPI implementation (Debian: libopenmpi-dev openmpi-bin), reconfigure with "
                "-DDISTJAX_WITH_MPI=ON, or use Backend::Threads");
}

bool mpi_available() { return false; }

}  // namespace distjax::comm::detail

namespace distjax::comm {

const std::vector<std::string>& process_hosts() {
  static const std::vector<std::string> none;
  return none;
}

}  // namespace distjax::comm
