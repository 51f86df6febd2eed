// The MPI backend's lifelines under `mpirun -np 4` (src/distjax/comm/mpi/lifelines.hpp):
// every process of a launch answers the others' probes; a probe tells a process that is
// gone (its port refuses) from a host that does not answer; and the account names the
// processes gone by host. What a survivor says when a host's processes are killed is
// tested end to end by `make test-hosts` (scripts/test_hosts_lost.py kill).
#include "mpi_test_main.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "distjax/comm/launch.hpp"
#include "distjax/comm/mpi/lifelines.hpp"

namespace distjax::comm::mpi {
namespace {

using namespace std::chrono_literals;

// A socket listening on 127.0.0.1 with room for `backlog` pending connections; its
// lifeline in *line.
int listen_local(int backlog, Lifeline* line) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, backlog), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  line->addrs[0] = a.sin_addr.s_addr;
  line->count = 1;
  line->port = ntohs(a.sin_port);
  return fd;
}

// A connection to `line`'s first address, completed (or -1).
int connect_to(const Lifeline& line) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(line.port);
  a.sin_addr.s_addr = line.addrs[0];
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(Lifelines, EveryProcessOfALaunchAnswers) {
  LaunchOptions o;
  o.backend = Backend::Mpi;
  int me = -1, n = 0;
  launch(o, [&](Communicator& world) {
    me = world.rank();
    n = world.size();
  });
  ASSERT_EQ(n, 4);
  std::vector<int> peers;
  for (int r = 0; r < n; ++r)
    if (r != me) peers.push_back(r);
  const std::vector<Liveness> states = probe_lifelines(peers, 5000ms);
  ASSERT_EQ(states.size(), peers.size());
  for (std::size_t i = 0; i < peers.size(); ++i)
    EXPECT_EQ(states[i], Liveness::Alive) << "device " << peers[i] << " from device " << me;
}

TEST(Lifelines, AClosedPortIsGoneAFullQueueSilentNoPortAlive) {
  Lifeline alive, gone, silent;
  const int a = listen_local(16, &alive);
  close(listen_local(16, &gone));  // nothing listens on its port any more
  // A listening socket whose accept queue is full (Linux queues backlog + 1 connections)
  // drops new connections unanswered, as a host that is cut off does.
  const int s = listen_local(0, &silent);
  const int queued = connect_to(silent);
  ASSERT_GE(queued, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Liveness> states = probe({alive, gone, silent, Lifeline{}}, 300ms);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(states.size(), 4u);
  EXPECT_EQ(states[0], Liveness::Alive);
  EXPECT_EQ(states[1], Liveness::Gone);
  EXPECT_EQ(states[2], Liveness::Silent);
  EXPECT_EQ(states[3], Liveness::Alive);  // no lifeline: nothing to say otherwise
  EXPECT_LT(waited, 5.0) << "a probe waits about its limit (0.3 s), not the TCP timeout";
  close(queued);
  close(a);
  close(s);
}

TEST(Lifelines, TheAccountNamesTheProcessesGoneByHost) {
  const std::vector<std::string> hosts = {"node-a", "node-a", "node-b", "node-b", "node-c"};
  using L = Liveness;
  EXPECT_EQ(describe_lost({L::Alive, L::Alive, L::Alive, L::Alive, L::Alive}, hosts, 0), "");
  // Self's own state is not looked at.
  EXPECT_EQ(describe_lost({L::Gone, L::Alive, L::Alive, L::Alive, L::Alive}, hosts, 0), "");
  EXPECT_EQ(describe_lost({L::Alive, L::Alive, L::Gone, L::Gone, L::Alive}, hosts, 0),
            "the processes of devices 2-3 on node-b are gone (the host answers, they do not)");
  EXPECT_EQ(describe_lost({L::Alive, L::Gone, L::Silent, L::Silent, L::Alive}, hosts, 0),
            "the process of device 1 on node-a is gone (the host answers, it does not); "
            "no process of host node-b answers (devices 2-3): the host is lost or its link is "
            "cut");
  EXPECT_EQ(describe_lost({L::Alive, L::Alive, L::Alive, L::Silent, L::Silent}, hosts, 0),
            "device 3 on node-b does not answer; no process of host node-c answers (device 4): "
            "the host is lost or its link is cut");
}

}  // namespace
}  // namespace distjax::comm::mpi

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
