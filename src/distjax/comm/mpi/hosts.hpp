// The hosts of an MPI job (private to src/distjax/comm/mpi): every process's host name,
// gathered once per process, and the verdict a timed-out call adds when a whole host is
// silent (lost, or its link cut), asking every process of that host.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "distjax/comm/mpi/flight_records.hpp"

namespace distjax::comm::mpi {

/// Gathers every process's host name on `world` (a duplicate of MPI_COMM_WORLD) unless an
/// earlier launch did; throws CommError at `deadline` (a process never arrived).
void gather_hosts(MPI_Comm world, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout, int rank);
/// The host of every world rank; empty before gather_hosts.
const std::vector<std::string>& world_hosts();
/// " on <host>" for world rank r, or "" when the hosts are unknown.
std::string on_host(int r);

/// Whether a call of this process timed out with devices that did not answer (a process
/// may be gone: MPI_Finalize could wait for it forever).
bool peers_silent();

/// After the call `seq` of group g timed out on world rank `self` and the group's devices
/// `silent` did not answer its flight query: asks every other process of their hosts
/// (until `until`) and returns "no process of host distjax-host1 answers (devices 4-7): the
/// host is lost or its link is cut" for each host none of whose processes answered, joined
/// by "; " (empty when every such host has one that answered, or the hosts are unknown).
std::string silent_hosts(const GroupRecords& g, std::uint64_t seq, int self,
                         const std::vector<int>& silent,
                         std::chrono::steady_clock::time_point until, bool (*peer_failed)());

}  // namespace distjax::comm::mpi
