// The launcher ending the job (private to src/distjax/comm/mpi). When a process of an MPI
// job dies, mpirun ends the others: SIGTERM, then SIGKILL after odls_base_sigkill_timeout
// seconds. The MPI launch catches that SIGTERM so that the device's wait in progress ends
// at once and says where it was and which devices and hosts are silent, instead of dying
// without a word.
#pragma once

#include <csignal>

namespace distjax::comm::mpi {

namespace sigterm_state {
inline volatile std::sig_atomic_t g_sigterm = 0;     // a SIGTERM arrived during a launch
inline volatile std::sig_atomic_t g_in_launch = 0;  // a launch runs
}  // namespace sigterm_state

/// Whether the launcher is ending the job (a SIGTERM arrived while a launch ran).
inline bool terminating() { return sigterm_state::g_sigterm != 0; }

/// Installs the SIGTERM handler (once per process) and marks a launch as running or not:
/// a SIGTERM outside a launch ends the process as it would have without the handler.
void catch_sigterm(bool in_launch);

}  // namespace distjax::comm::mpi
