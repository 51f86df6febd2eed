#include "distjax/comm/mpi/hosts.hpp"

#include <utility>

#include "distjax/comm/detail/call_desc.hpp"

namespace distjax::comm::mpi {

namespace {

std::vector<std::string>& hosts() {
  static std::vector<std::string> h;  // only the device's thread: one per process
  return h;
}

bool g_silent = false;

}  // namespace

bool peers_silent() { return g_silent; }
void note_silent_peers() { g_silent = true; }

void set_world_hosts(std::vector<std::string> h) { hosts() = std::move(h); }

const std::vector<std::string>& world_hosts() { return hosts(); }

std::string host_silent(const std::string& host, const std::vector<int>& devices) {
  return "no process of host " + host + " answers (" + detail::devices_in_ranges(devices) +
         "): the host is lost or its link is cut";
}

std::string on_host(int r) {
  const std::vector<std::string>& h = hosts();
  if (r < 0 || r >= static_cast<int>(h.size())) return "";
  return " on " + h[static_cast<std::size_t>(r)];
}

}  // namespace distjax::comm::mpi
