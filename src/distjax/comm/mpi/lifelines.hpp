// The MPI backend's lifelines (private to src/distjax/comm/mpi): every process listens on a
// TCP socket of its own, and the first launch gathers everyone's addresses, so that a
// process can tell without MPI which of the others are still there. A connection to a
// process's lifeline is accepted by its kernel while the process lives (nothing has to
// answer); refused when its host is up but the process is gone; and unanswered when the
// host is down or cut off.
//
// And the sentinel, which needs them: when a process of the job dies, the launcher ends the
// others (mpirun: SIGTERM, then SIGKILL), and their device threads may be held inside MPI
// meanwhile (Open MPI's TCP transport reports the failed connection to the dead process
// through mpirun, which is busy tearing the job down). On SIGTERM during a launch, the
// sentinel thread asks every lifeline, and if processes are gone, gives this process's
// account of what happened (the call the device was in, the processes gone and their
// hosts) on stderr and in the launch's error file, then ends the process with status 1.
// With no process gone (a job cancelled), SIGTERM does what it did before the sentinel, 0.3 s
// later: meanwhile the process still answers the others' probes.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace distjax::comm::mpi {

/// What a lifeline said.
enum class Liveness { Alive, Gone, Silent };

/// Where a process's lifeline listens: a port and up to kAddrs IPv4 addresses (network byte
/// order), sent between processes as plain bytes.
struct Lifeline {
  static constexpr int kAddrs = 4;
  std::uint32_t addrs[kAddrs] = {};
  std::uint16_t port = 0;  // 0: the process has no lifeline
  std::uint16_t count = 0;
};

/// Opens this process's lifeline and gathers every process's on `world` (collective; once per
/// process: later calls return at once). A process that cannot listen (no socket, no IPv4
/// address) publishes none, and probes of it say Alive.
void open_lifelines(MPI_Comm world, std::chrono::steady_clock::time_point deadline,
                    std::chrono::milliseconds timeout, int rank);

/// Asks each lifeline, waiting at most `limit` for the answers: Alive when a connection to
/// one of its addresses is accepted (or it has no port), else Gone when one is refused, else
/// Silent.
std::vector<Liveness> probe(const std::vector<Lifeline>& lines, std::chrono::milliseconds limit);
/// probe() of the lifelines of world ranks `peers` (Alive for a rank without one).
std::vector<Liveness> probe_lifelines(const std::vector<int>& peers,
                                      std::chrono::milliseconds limit);

/// "the processes of devices 4-7 on distjax-host1 are gone (their host refuses connections
/// to them); no process of host distjax-host2 answers (devices 8-11): the host is lost or its
/// link is cut": the processes other than `self` not Alive in `states` (one per world rank,
/// self included), grouped by their `hosts` (one per world rank); empty when all are Alive.
std::string describe_lost(const std::vector<Liveness>& states,
                          const std::vector<std::string>& hosts, int self);

/// Starts the sentinel (once per process) and points it at this launch: world rank `rank`,
/// whose account goes to stderr and, unless empty, to `error_file`.
void sentinel_watch(int rank, const std::string& error_file);
/// The launch ended: SIGTERM is again what it was.
void sentinel_release();
/// Claims the process's account of a failure for the device's own error (the launch's
/// catch); false when the sentinel gave its account already (the process is ending).
bool claim_account();
/// Writes `what` to `file` (making its directory) unless `file` is empty: the launch's error
/// file (LaunchOptions::error_file).
void keep_error(const std::string& file, const std::string& what);

}  // namespace distjax::comm::mpi
