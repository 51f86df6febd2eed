// launch: dispatches to the threads backend, the MPI backend or the NCCL backend (or their
// stubs).
#include "distjax/comm/launch.hpp"

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/nccl/nccl_api.hpp"

namespace distjax::comm {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Threads:
      return "threads";
    case Backend::Mpi:
      return "mpi";
    case Backend::Nccl:
      return "nccl";
  }
  return "?";
}

void launch(const LaunchOptions& opts, const std::function<void(Communicator& world)>& fn) {
  if (opts.backend == Backend::Mpi) return detail::launch_mpi(opts, fn);
  if (opts.backend == Backend::Nccl) return detail::launch_nccl(opts, fn);
  detail::launch_threads(opts, fn);
}

bool backend_available(Backend b) {
  switch (b) {
    case Backend::Threads:
      return true;
    case Backend::Mpi:
      return detail::mpi_available();
    case Backend::Nccl:
      return detail::built_with_nccl();
  }
  return false;
}

}  // namespace distjax::comm
