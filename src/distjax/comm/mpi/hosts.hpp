// The hosts of an MPI job (private to src/distjax/comm/mpi): every process's host name,
// gathered once per process by the launch, and whether a call found silent devices.
#pragma once

#include <string>
#include <vector>

namespace distjax::comm::mpi {

/// Sets the host of every world rank (the launch gathers them once).
void set_world_hosts(std::vector<std::string> hosts);
/// The host of every world rank; empty before the first launch.
const std::vector<std::string>& world_hosts();
/// " on <host>" for world rank r, or "" when the hosts are unknown.
std::string on_host(int r);

/// "no process of host <host> answers (devices 4-7): the host is lost or its link is cut":
/// the one wording of a whole host silent, whichever check found it (the flight records'
/// census after a timeout, or the lifelines' probe when the launcher ends the job).
std::string host_silent(const std::string& host, const std::vector<int>& devices);

/// Whether a call of this process timed out with devices that did not answer (a process
/// may be gone: MPI_Finalize could wait for it forever).
bool peers_silent();

/// Records that a call found silent devices (silent_hosts does).
void note_silent_peers();

}  // namespace distjax::comm::mpi
