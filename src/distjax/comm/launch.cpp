// launch: dispatches to the threads backend, the MPI backend or the NCCL backend (or their
// stubs).
#include "distjax/comm/launch.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/detail/call_desc.hpp"
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

std::string describe_hosts(const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> by_host;  // in order of first rank
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const std::string& h = hosts[static_cast<std::size_t>(r)];
    auto it =
        std::find_if(by_host.begin(), by_host.end(), [&](const auto& e) { return e.first == h; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {h, {}});
    it->second.push_back(r);
  }
  std::ostringstream os;
  os << hosts.size() << " on " << by_host.size() << (by_host.size() == 1 ? " host:" : " hosts:");
  for (std::size_t i = 0; i < by_host.size(); ++i) {
    const std::vector<int>& ranks = by_host[i].second;
    os << (i ? ", " : " ") << by_host[i].first << (ranks.size() == 1 ? " (rank " : " (ranks ")
       << detail::join_ranges(ranks) << ")";
  }
  return os.str();
}

}  // namespace distjax::comm
