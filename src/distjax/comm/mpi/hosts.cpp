#include "distjax/comm/mpi/hosts.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <sstream>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/mpi/guards.hpp"
#include "distjax/comm/mpi/termination.hpp"

namespace distjax::comm::mpi {

namespace {

constexpr int kNameBytes = 64;  // a host name of up to 63 bytes (HOST_NAME_MAX is 64)

std::vector<std::string>& hosts() {
  static std::vector<std::string> h;  // only the device's thread: one per process
  return h;
}

bool g_silent = false;

}  // namespace

bool peers_silent() { return g_silent; }

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

void gather_hosts(MPI_Comm world, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout, int rank) {
  if (!hosts().empty()) return;
  int size = 1;
  MPI_Comm_size(world, &size);
  std::array<char, kNameBytes> mine{};
  if (gethostname(mine.data(), kNameBytes - 1) != 0) std::strcpy(mine.data(), "?");
  auto all = std::make_shared<std::vector<char>>(static_cast<std::size_t>(size) * kNameBytes);
  MPI_Request r;
  guards::check(MPI_Iallgather(mine.data(), kNameBytes, MPI_CHAR, all->data(), kNameBytes,
                               MPI_CHAR, world, &r),
                "launch", rank);
  guards::wait_setup(r, all, deadline, timeout, "launch", "gathering the processes' hosts",
                     rank);
  std::vector<std::string> h(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) {
    const char* p = all->data() + static_cast<std::size_t>(i) * kNameBytes;
    h[static_cast<std::size_t>(i)] = std::string(p, strnlen(p, kNameBytes));
  }
  hosts() = std::move(h);
}

const std::vector<std::string>& world_hosts() { return hosts(); }

std::string on_host(int r) {
  const std::vector<std::string>& h = hosts();
  if (r < 0 || r >= static_cast<int>(h.size())) return "";
  return " on " + h[static_cast<std::size_t>(r)];
}

std::string silent_hosts(const GroupRecords& g, std::uint64_t seq, int self,
                         const std::vector<int>& silent,
                         std::chrono::steady_clock::time_point until, bool (*peer_failed)()) {
  if (!silent.empty()) g_silent = true;
  const std::vector<std::string>& h = hosts();
  if (h.empty() || silent.empty()) return "";
  std::vector<std::string> named;  // the silent devices' hosts, in order of first mention
  for (int r : silent)
    if (r >= 0 && r < static_cast<int>(h.size()) &&
        std::find(named.begin(), named.end(), h[static_cast<std::size_t>(r)]) == named.end())
      named.push_back(h[static_cast<std::size_t>(r)]);
  // The other processes of those hosts: one query for all of them.
  std::vector<int> others;
  for (int r = 0; r < static_cast<int>(h.size()); ++r)
    if (r != self && std::find(silent.begin(), silent.end(), r) == silent.end() &&
        std::find(named.begin(), named.end(), h[static_cast<std::size_t>(r)]) != named.end())
      others.push_back(r);
  const std::vector<PeerRecord> recs = flight_query(g, seq, others, until, peer_failed);
  std::ostringstream out;
  for (const std::string& host : named) {
    std::vector<int> ranks;
    bool answered = false;
    for (int r = 0; r < static_cast<int>(h.size()); ++r) {
      if (h[static_cast<std::size_t>(r)] != host) continue;
      ranks.push_back(r);
      const auto it = std::find(others.begin(), others.end(), r);
      if (r == self ||
          (it != others.end() && recs[static_cast<std::size_t>(it - others.begin())].answered))
        answered = true;
    }
    if (answered) continue;
    if (out.tellp() > 0) out << "; ";
    out << "no process of host " << host << " answers (" << (ranks.size() == 1 ? "device " : "devices ")
        << detail::join_ranges(ranks) << "): the host is lost or its link is cut";
  }
  return out.str();
}

}  // namespace distjax::comm::mpi
