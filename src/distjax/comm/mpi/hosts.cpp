#include "distjax/comm/mpi/hosts.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <sstream>

#include "distjax/comm/mpi/termination.hpp"

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

namespace {
void on_sigterm(int) {
  if (sigterm_state::g_in_launch) {
    sigterm_state::g_sigterm = 1;
    return;
  }
  std::signal(SIGTERM, SIG_DFL);
  std::raise(SIGTERM);
}
}  // namespace

void catch_sigterm(bool in_launch) {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGTERM, &sa, nullptr) == 0;
  }();
  (void)installed;
  sigterm_state::g_in_launch = in_launch ? 1 : 0;
}

void set_world_hosts(std::vector<std::string> h) { hosts() = std::move(h); }

const std::vector<std::string>& world_hosts() { return hosts(); }

std::string on_host(int r) {
  const std::vector<std::string>& h = hosts();
  if (r < 0 || r >= static_cast<int>(h.size())) return "";
  return " on " + h[static_cast<std::size_t>(r)];
}

}  // namespace distjax::comm::mpi
