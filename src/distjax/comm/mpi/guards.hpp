// The MPI backend's guards against silent hangs, shared by its communicator and launch
// (private to src/distjax/comm/mpi): the deadline-polled waits that listen to the notices
// of other processes (notices.hpp), advance the calls in flight that only advance when
// polled, and back off once a reply is late; and the watchdog (watchdog.hpp).
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distjax/comm/mpi/backoff.hpp"
#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/comm/mpi/notices.hpp"
#include "distjax/comm/mpi/watchdog.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi::guards {

/// Buffers of abandoned collectives: MPI cannot cancel those, so their memory is kept
/// until the process ends.
inline std::vector<std::shared_ptr<void>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<void>>();
  return *g;
}

/// How long a wait keeps polling after an abort notice or a verdict that a device it needs
/// left (poll_left), so a call that can still complete does (and leaves no request
/// behind); the next call then fails.
inline constexpr std::chrono::milliseconds kAbortGrace{100};

/// How a wait ended: done, at its deadline, on an abort notice (poll_abort), or on a
/// device that left it (poll_left).
enum class WaitResult { Done, TimedOut, Aborted, Left };

// ---------------------------------------------------------------- pending calls
/// A call in flight that advances only when this process polls it: the later steps of
/// an exchange (exchange.hpp), a data operation posted once its check passed. Every wait
/// advances all of them (advance_pending), as MPI progresses its own nonblocking
/// collectives, so requests waited on in different orders on different devices, or on
/// different groups, do not wait on each other. advance() never throws and never blocks;
/// what fails is left for the call's own wait to report.
struct Pending {
  virtual void advance() noexcept = 0;
  bool registered = false;

 protected:
  ~Pending() = default;
};
/// The calls of this process that are in flight and need advancing (only the device's
/// thread touches them: one device per process).
inline std::vector<Pending*>& pending() {
  static auto* p = new std::vector<Pending*>();
  return *p;
}
inline void add_pending(Pending* c) {
  if (c->registered) return;
  c->registered = true;
  pending().push_back(c);
}
inline void remove_pending(Pending* c) {
  if (!c->registered) return;
  c->registered = false;
  auto& p = pending();
  p.erase(std::find(p.begin(), p.end(), c));
}
/// Advances every pending call (advance() may remove the call from the list).
inline void advance_pending() {
  auto& p = pending();
  for (std::size_t i = 0; i < p.size();) {
    Pending* c = p[i];
    c->advance();
    if (i < p.size() && p[i] == c) ++i;
  }
}

/// Calls done() until it returns true (WaitResult::Done), the deadline passes, an abort
/// notice arrives, or a finished notice says a device the awaited call needs left it.
/// done() is looked at on every spin: a reply usually comes within a few, so the clock,
/// the notices and peers' flight-record queries are looked at only every 64th spin, and
/// the core is given away (it may be shared with the other ranks) only after kPollSpins,
/// then at every poll, yielding first and sleeping once the wait is long (Backoff).
/// Meanwhile it advances the other pending calls. `window`: how long it yields before it
/// sleeps (Backoff::yield_window of the bytes the wait moves).
inline constexpr unsigned kPollSpins = 256;
template <class Done>
WaitResult poll_until(Done&& done, Clock::time_point deadline,
                      std::chrono::nanoseconds window = Backoff::kYieldFor) {
  bool aborted = false, left = false;
  Clock::time_point start;
  Backoff backoff(window);
  for (unsigned spins = 1;; ++spins) {
    if (done()) return WaitResult::Done;
    if (!pending().empty()) advance_pending();
    if (spins < kPollSpins && (spins & 63) != 0) continue;
    flight_serve();  // peers diagnosing a timeout ask us
    const bool look_aborted = !aborted && poll_abort() != nullptr;
    const bool look_left = !left && poll_left() != nullptr;
    const Clock::time_point now = Clock::now();
    if (look_aborted || look_left) deadline = std::min(deadline, now + kAbortGrace);
    aborted = aborted || look_aborted;
    left = left || look_left;
    if (now > deadline)
      return left ? WaitResult::Left : aborted ? WaitResult::Aborted : WaitResult::TimedOut;
    if (spins == kPollSpins) start = now;
    if (spins >= kPollSpins) backoff.pause(start, now);
  }
}

/// Polls reqs until all complete (done[i] turns 1 as request i does), the deadline
/// passes, or a notice ends the wait (see poll_until; `window` too). Completed requests
/// become MPI_REQUEST_NULL.
inline WaitResult poll(MPI_Request* reqs, int* done, std::size_t n, Clock::time_point deadline,
                       const char* op, int device,
                       std::chrono::nanoseconds window = Backoff::kYieldFor) {
  return poll_until(
      [&] {
        bool all = true;
        for (std::size_t i = 0; i < n; ++i) {
          if (done[i]) continue;
          check(MPI_Test(&reqs[i], &done[i], MPI_STATUS_IGNORE), op, device);
          all = all && done[i];
        }
        return all;
      },
      deadline, window);
}

/// Waits for one nonblocking call made while setting up a communicator; throws
/// CommError on timeout or abort notice (the request is then abandoned, and `out`, the
/// memory MPI writes its result to, is kept alive).
inline void wait_setup(MPI_Request& r, std::shared_ptr<void> out, Clock::time_point deadline,
                       std::chrono::milliseconds timeout, const char* op, const char* what,
                       int device) {
  int done = 0;
  WaitResult w = poll(&r, &done, 1, deadline, op, device);
  if (w == WaitResult::Done) return;
  r = MPI_REQUEST_NULL;
  graveyard().push_back(std::move(out));
  if (w == WaitResult::Aborted)
    DISTJAX_THROW(CommError, "[", op, "] ", what, " abandoned: ", *poll_abort());
  if (w == WaitResult::Left) DISTJAX_THROW(CommError, "[", op, "] ", what, ": ", left_failure());
  DISTJAX_THROW(CommError, "[", op, "] timed out after ", timeout.count(), " ms in ", what,
                " on device ", device, ": some device did not arrive");
}

}  // namespace distjax::comm::mpi::guards
