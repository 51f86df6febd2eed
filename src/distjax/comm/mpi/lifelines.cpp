// The MPI backend's lifelines and sentinel (see lifelines.hpp).
#include "distjax/comm/mpi/lifelines.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/comm/mpi/guards.hpp"
#include "distjax/comm/mpi/hosts.hpp"

namespace distjax::comm::mpi {

namespace {

using Clock = std::chrono::steady_clock;

struct Lifelines {
  int fd = -1;              // this process's listening socket
  std::vector<Lifeline> lines;  // every world rank's; empty before the first launch
};
Lifelines& lifelines() {
  static auto* l = new Lifelines();  // never destroyed: the sentinel thread uses it
  return *l;
}

// Listens on every address of this host (the kernel completes the connections, which the
// sentinel accepts and closes) and says where: the host's IPv4 addresses that are up,
// loopback only when it has no other.
Lifeline listen_here(int* fd_out) {
  Lifeline line;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return line;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return line;
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr && line.count < Lifeline::kAddrs; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      line.addrs[line.count++] = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(ifs);
  }
  if (line.count == 0) line.addrs[line.count++] = htonl(INADDR_LOOPBACK);
  line.port = ntohs(a.sin_port);
  *fd_out = fd;
  return line;
}

// One connection attempt of a probe: the peer it asks and its socket.
struct Attempt {
  std::size_t peer;
  int fd;
};

}  // namespace

void open_lifelines(MPI_Comm world, Clock::time_point deadline, std::chrono::milliseconds timeout,
                    int rank) {
  Lifelines& l = lifelines();
  if (!l.lines.empty()) return;
  int size = 1;
  MPI_Comm_size(world, &size);
  const Lifeline mine = listen_here(&l.fd);
  auto all = std::make_shared<std::vector<Lifeline>>(static_cast<std::size_t>(size));
  MPI_Request r;
  guards::check(MPI_Iallgather(&mine, sizeof(Lifeline), MPI_BYTE, all->data(), sizeof(Lifeline),
                               MPI_BYTE, world, &r),
                "launch", rank);
  guards::wait_setup(r, all, deadline, timeout, "launch", "gathering the processes' lifelines",
                     rank);
  l.lines = *all;
}

std::vector<Liveness> probe_lifelines(const std::vector<int>& peers,
                                      std::chrono::milliseconds limit) {
  const std::vector<Lifeline>& all = lifelines().lines;
  std::vector<Lifeline> lines;
  for (int p : peers)
    lines.push_back(p >= 0 && p < static_cast<int>(all.size()) ? all[static_cast<std::size_t>(p)]
                                                               : Lifeline{});
  return probe(lines, limit);
}

std::vector<Liveness> probe(const std::vector<Lifeline>& lines, std::chrono::milliseconds limit) {
  std::vector<Liveness> out(lines.size(), Liveness::Alive);
  // Per line: an address accepted, one refused.
  std::vector<char> accepted(lines.size(), 0), refused(lines.size(), 0), asked(lines.size(), 0);
  std::vector<Attempt> open;
  auto settle = [&](const Attempt& a, int err) {
    if (err == 0) accepted[a.peer] = 1;
    if (err == ECONNREFUSED) refused[a.peer] = 1;
    close(a.fd);
  };
  // At most kBatch sockets at once (a job of thousands of processes).
  constexpr std::size_t kBatch = 512;
  std::size_t next = 0;
  while (next < lines.size()) {
    for (; next < lines.size() && open.size() < kBatch; ++next) {
      const Lifeline& line = lines[next];
      if (line.port == 0) continue;  // no lifeline: taken as alive
      asked[next] = 1;
      for (int k = 0; k < line.count; ++k) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(line.port);
        a.sin_addr.s_addr = line.addrs[k];
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0)
          settle({next, fd}, 0);
        else if (errno == EINPROGRESS)
          open.push_back({next, fd});
        else
          settle({next, fd}, errno);
      }
    }
    const Clock::time_point until = Clock::now() + limit;
    while (!open.empty()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) break;
      std::vector<pollfd> fds(open.size());
      for (std::size_t i = 0; i < open.size(); ++i)
        fds[i] = {.fd = open[i].fd, .events = POLLOUT, .revents = 0};
      if (poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
      std::vector<Attempt> still;
      for (std::size_t i = 0; i < open.size(); ++i) {
        if (fds[i].revents == 0) {
          still.push_back(open[i]);
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(open[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
        settle(open[i], err);
      }
      open = std::move(still);
    }
    for (const Attempt& a : open)
      settle(a, ETIMEDOUT);
    open.clear();
  }
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (asked[i] && !accepted[i]) out[i] = refused[i] ? Liveness::Gone : Liveness::Silent;
  return out;
}

std::string describe_lost(const std::vector<Liveness>& states,
                          const std::vector<std::string>& hosts, int self) {
  const int n = static_cast<int>(states.size());
  auto host_of = [&](int r) {
    return r < static_cast<int>(hosts.size()) ? hosts[static_cast<std::size_t>(r)]
                                              : std::string("?");
  };
  std::vector<std::string> seen;
  std::ostringstream out;
  auto sep = [&] {
    if (out.tellp() > 0) out << "; ";
  };
  for (int r = 0; r < n; ++r) {
    const std::string host = host_of(r);
    if (std::find(seen.begin(), seen.end(), host) != seen.end()) continue;
    seen.push_back(host);
    std::vector<int> all, gone, silent;
    for (int q = r; q < n; ++q) {
      if (host_of(q) != host || q == self) continue;
      all.push_back(q);
      if (states[static_cast<std::size_t>(q)] == Liveness::Gone) gone.push_back(q);
      if (states[static_cast<std::size_t>(q)] == Liveness::Silent) silent.push_back(q);
    }
    if (!silent.empty() && silent.size() == all.size() && host != host_of(self)) {
      sep();
      out << host_silent(host, all);
      continue;
    }
    if (!gone.empty()) {
      sep();
      out << (gone.size() == 1 ? "the process of " : "the processes of ")
          << detail::devices_in_ranges(gone) << " on " << host
          << (gone.size() == 1 ? " is" : " are") << " gone (the host answers, "
          << (gone.size() == 1 ? "it does" : "they do") << " not)";
    }
    if (!silent.empty()) {
      sep();
      out << detail::devices_in_ranges(silent) << " on " << host
          << (silent.size() == 1 ? " does" : " do") << " not answer";
    }
  }
  return out.str();
}

// ---------------------------------------------------------------- sentinel
namespace {

struct Sentinel {
  int wake[2] = {-1, -1};  // SIGTERM's handler writes to wake[1]
  struct sigaction previous {};
  std::mutex m;
  bool watching = false;  // a launch is running
  int rank = 0;
  std::string error_file;
  std::atomic<bool> claimed{false};  // the account of this launch's failure is being given
};
Sentinel& sentinel() {
  static auto* s = new Sentinel();  // never destroyed: its thread outlives statics
  return *s;
}

// How long a process with no peer gone lives on after SIGTERM (on_terminate).
constexpr std::chrono::milliseconds kLinger{300};

void on_sigterm(int) {
  const int saved = errno;
  const char c = 1;
  [[maybe_unused]] const ssize_t n = write(sentinel().wake[1], &c, 1);
  errno = saved;
}

// SIGTERM as it was before the sentinel: the previous handler, or the default (ending the
// process), or nothing if it was ignored.
void pass_on() {
  const struct sigaction& p = sentinel().previous;
  if (p.sa_handler == SIG_IGN) return;
  if (p.sa_handler == SIG_DFL) {
    sigaction(SIGTERM, &p, nullptr);
    raise(SIGTERM);
    return;
  }
  if ((p.sa_flags & SA_SIGINFO) != 0)
    p.sa_sigaction(SIGTERM, nullptr, nullptr);
  else
    p.sa_handler(SIGTERM);
}

void keep_account(const std::string& file, const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::fflush(stderr);
  keep_error(file, what);
}

// SIGTERM arrived: if a launch runs and processes of the job are gone, gives the account
// and ends the process; otherwise passes the signal on.
void on_terminate() {
  Sentinel& s = sentinel();
  int rank = 0;
  std::string file;
  {
    std::lock_guard<std::mutex> lk(s.m);
    if (!s.watching) return pass_on();
    rank = s.rank;
    file = s.error_file;
  }
  if (s.claimed.load()) return;  // the device is giving its own account
  const int n = static_cast<int>(lifelines().lines.size());
  std::vector<int> peers;
  for (int r = 0; r < n; ++r)
    if (r != rank) peers.push_back(r);
  const std::vector<Liveness> answers = probe_lifelines(peers, std::chrono::milliseconds(500));
  std::vector<Liveness> states(static_cast<std::size_t>(n), Liveness::Alive);
  for (std::size_t i = 0; i < peers.size(); ++i)
    states[static_cast<std::size_t>(peers[i])] = answers[i];
  const std::string lost = describe_lost(states, world_hosts(), rank);
  if (lost.empty()) {
    // A job cancelled: every process gets SIGTERM at about the same time. Lingering a little
    // keeps this one answering the others' probes, so none takes it for a process gone.
    std::this_thread::sleep_for(kLinger);
    return pass_on();
  }
  if (s.claimed.exchange(true)) return;
  std::string where = flight_describe_wait();
  if (where.empty()) where = "[launch] device " + std::to_string(rank) + ", outside any call,";
  keep_account(file, where + " cannot complete: " + lost +
                         "; the launcher is ending the job (SIGTERM) (raised on device " +
                         std::to_string(rank) + ")");
  std::_Exit(1);
}

void sentinel_loop() {
  Sentinel& s = sentinel();
  const int listener = lifelines().fd;
  for (;;) {
    pollfd fds[2] = {{.fd = s.wake[0], .events = POLLIN, .revents = 0},
                     {.fd = listener, .events = POLLIN, .revents = 0}};
    if (poll(fds, listener >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      // poll itself fails (no memory): SIGTERM goes back to what it was before, so that the
      // launcher can still end this process, and the sentinel stops.
      sigaction(SIGTERM, &s.previous, nullptr);
      char c;
      if (read(s.wake[0], &c, 1) > 0) pass_on();  // one came before the handler went back
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) {  // probes: the connection was the answer
      int c;
      while ((c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) >= 0)
        close(c);
      // Out of descriptors: the probe stays queued (the kernel accepted it, which is the
      // answer); wait a little rather than spin on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if ((fds[0].revents & POLLIN) != 0) {
      char buf[16];
      while (read(s.wake[0], buf, sizeof(buf)) > 0) {
      }
      on_terminate();
    }
  }
}

}  // namespace

void sentinel_watch(int rank, const std::string& error_file) {
  Sentinel& s = sentinel();
  static const bool started = [&s] {
    if (pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    struct sigaction a {};
    a.sa_handler = on_sigterm;
    sigemptyset(&a.sa_mask);
    a.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &a, &s.previous);
    std::thread(sentinel_loop).detach();
    return true;
  }();
  (void)started;
  std::lock_guard<std::mutex> lk(s.m);
  s.watching = true;
  s.rank = rank;
  s.error_file = error_file;
  s.claimed = false;
}

void sentinel_release() {
  Sentinel& s = sentinel();
  std::lock_guard<std::mutex> lk(s.m);
  s.watching = false;
}

bool claim_account() { return !sentinel().claimed.exchange(true); }

void keep_error(const std::string& file, const std::string& what) {
  if (file.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  std::ofstream(file) << what << "\n";
}

}  // namespace distjax::comm::mpi
