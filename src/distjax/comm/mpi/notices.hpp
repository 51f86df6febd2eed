// The MPI backend's notices between processes (private to src/distjax/comm/mpi): on one
// process-wide channel a process tells every other one that its device program failed
// (an abort notice) or returned (a finished notice, saying how many calls it issued on
// each of its groups). Every wait looks at both: an abort notice fails it; a finished
// notice fails it when the device that finished never issued the call waited on (or left
// the transfer waited on), long before the timeout. A process whose program returned
// waits for the others' notices, and fails when one says it failed because this one left.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <string>

namespace distjax::comm::mpi {

/// Opens the channel for a new launch (an epoch: the tag of its notices), creating it on
/// first use; `device` is this process's world rank.
void open_epoch(std::chrono::milliseconds timeout, int device);

/// Closes this launch's epoch: withdraws the posted receive. Notices that arrive later
/// (other processes still failing) keep this epoch's tag and are never matched again.
void close_epoch();

/// Receives the notices that have arrived (never blocks); returns "device N failed: <its
/// message>" if an abort notice is among those of this epoch, else nullptr.
const std::string* poll_abort();

/// After poll_abort: why the call or transfer the device waits on (flight_awaited) can
/// never complete, from the finished notices, or nullptr. For a call, exact: a device
/// that finished without issuing it, or after its group failed there ("[all_reduce]
/// cannot complete call #4 of group (0,1,2,3): device 1 did not arrive (device 1
/// finished its program after 4 calls on this group)"); for a transfer, the peer
/// finished (its message, if it sent one, arrives within the waits' grace period).
const std::string* poll_left();

/// The verdict of the last wait that ended on poll_left, for its error; records the
/// devices it names, so this process's notices tell them they left it.
std::string left_failure();

/// Tells every other process that this process's device program failed with `what`,
/// unless it learned of a failure from an abort notice itself (everyone has that one) and
/// has no device to tell that it left this one.
void send_abort(const std::string& what);

/// The end of a launch whose device program returned, in three steps (the launch waits
/// between the second and the third with the waits of guards.hpp, which listen to these
/// notices): tells every other process, returning false when there is none to wait for;
bool send_finished();
/// whether each other process has finished or failed (receives the notices that arrived);
bool heard_from_all();
/// throws CommError when one failed because this device finished while it waited on it
/// ("[launch] device 1 finished its program while device 0 waited on it: [all_reduce]
/// cannot complete call #4 ...").
void throw_if_blamed(int device);

}  // namespace distjax::comm::mpi
