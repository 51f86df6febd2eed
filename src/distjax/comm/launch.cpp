// launch: dispatches to the threads backend or the MPI backend (or its stub).
#include "distjax/comm/launch.hpp"

#include "distjax/comm/detail/call.hpp"

namespace distjax::comm {

const char* backend_name(Backend b) { return b == Backend::Threads ? "threads" : "mpi"; }

void launch(const LaunchOptions& opts, const std::function<void(Communicator& world)>& fn) {
  if (opts.backend == Backend::Mpi) return detail::launch_mpi(opts, fn);
  detail::launch_threads(opts, fn);
}

bool backend_available(Backend b) { return b == Backend::Threads || detail::mpi_available(); }

}  // namespace distjax::comm
