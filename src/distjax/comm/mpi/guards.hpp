// The MPI backend's guards against silent hangs, shared by its communicator and launch
// (private to src/distjax/comm/mpi): the watchdog that aborts a job blocked in a call MPI
// only has in blocking form, the process-wide abort channel on which a failing process
// tells the others, and the deadline-polled waits that listen to it and advance the
// calls in flight that only advance when polled.
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
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi::guards {

using Clock = std::chrono::steady_clock;

/// Throws CommError with MPI's error string when rc is not MPI_SUCCESS (defined in
/// mpi_communicator.cpp).
void check(int rc, const char* op, int device);

// ---------------------------------------------------------------- watchdog
/// Last resort against hangs inside the few MPI calls that only exist in blocking form:
/// arm() before such a call, disarm() after; if the call is still running at the
/// deadline, the watchdog thread prints what blocked and ends the job with MPI_Abort.
/// One slot: only the device's own thread arms it, one call at a time.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: its thread outlives statics
    return *w;
  }
  std::uint64_t arm(Clock::time_point deadline, std::string what) {
    std::lock_guard<std::mutex> lk(m_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    armed_ = true;
    deadline_ = deadline;
    what_ = std::move(what);
    cv_.notify_one();
    return ++token_;
  }
  void disarm(std::uint64_t token) {
    std::lock_guard<std::mutex> lk(m_);
    if (token == token_) armed_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      if (!armed_) {
        cv_.wait(lk);
      } else if (Clock::now() >= deadline_) {
        std::fprintf(stderr, "%s\n", what_.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 70);
        std::_Exit(70);
      } else {
        cv_.wait_until(lk, deadline_);
      }
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  bool started_ = false, armed_ = false;
  Clock::time_point deadline_;
  std::string what_;
  std::uint64_t token_ = 0;
};

/// Runs a blocking MPI call f() under the watchdog; returns its error code.
template <class F>
int guarded(std::chrono::milliseconds limit, const std::string& what, F&& f) {
  Watchdog& w = Watchdog::get();
  const std::uint64_t token = w.arm(Clock::now() + limit, what);
  const int rc = f();
  w.disarm(token);
  return rc;
}

/// "[split] device 1 blocked in MPI_Comm_split for more than 500 ms at call #2 of group
/// (0,1,2,3) ...": the watchdog's message.
inline std::string blocked_message(const char* op, const char* mpi_call, int device,
                                   std::chrono::milliseconds limit, const std::string& where) {
  std::ostringstream os;
  os << "[" << op << "] CommError: device " << device << " blocked in " << mpi_call
     << " for more than " << limit.count() << " ms" << where
     << " (a peer failed or never arrived); DistJax aborts the MPI job instead of hanging";
  return os.str();
}

// ---------------------------------------------------------------- abort channel
/// Process-wide channel on which a failing process tells every other process that its
/// device program threw. Each launch is one epoch (a tag): every process keeps one
/// receive posted for the current epoch, and every wait polls it.
inline constexpr int kNoticeBytes = 2048;
struct AbortChannel {
  MPI_Comm comm = MPI_COMM_NULL;
  int tag_ub = 32767;
  std::uint64_t epoch = 0;
  MPI_Request recv = MPI_REQUEST_NULL;
  char buf[kNoticeBytes] = {};
  bool received = false;
  std::string notice;            // "device N failed: <its message>"
  std::deque<std::string> sent;  // send buffers (kept alive: the sends are freed)
  int tag() const { return static_cast<int>(epoch % static_cast<std::uint64_t>(tag_ub)); }
};
inline AbortChannel& channel() {
  static AbortChannel* c = new AbortChannel();
  return *c;
}

/// The notice of this epoch if one has arrived (never blocks), else nullptr.
inline const std::string* poll_abort() {
  AbortChannel& ch = channel();
  if (ch.received) return &ch.notice;
  if (ch.recv == MPI_REQUEST_NULL) return nullptr;
  int flag = 0;
  MPI_Status st;
  if (MPI_Test(&ch.recv, &flag, &st) != MPI_SUCCESS || !flag) return nullptr;
  int len = 0;
  MPI_Get_count(&st, MPI_CHAR, &len);
  ch.received = true;
  ch.notice = "device " + std::to_string(st.MPI_SOURCE) +
              " failed: " + std::string(ch.buf, static_cast<std::size_t>(std::max(0, len)));
  return &ch.notice;
}

/// Buffers of abandoned collectives: MPI cannot cancel those, so their memory is kept
/// until the process ends.
inline std::vector<std::shared_ptr<void>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<void>>();
  return *g;
}

/// How long a wait keeps polling after an abort notice, so a call that can still
/// complete does (and leaves no request behind); the next call then fails.
inline constexpr std::chrono::milliseconds kAbortGrace{100};

enum class WaitResult { Done, TimedOut, Aborted };

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

/// Calls done() until it returns true (WaitResult::Done), the deadline passes, or an
/// abort notice arrives. done() is looked at on every spin: a reply usually comes within
/// a few, so the clock, the abort channel and peers' flight-record queries are looked at
/// only every 64th spin, and the core is given away (it may be shared with the other
/// ranks) only after kPollSpins. Meanwhile it advances the other pending calls.
inline constexpr unsigned kPollSpins = 256;
template <class Done>
WaitResult poll_until(Done&& done, Clock::time_point deadline) {
  bool aborted = false;
  for (unsigned spins = 1;; ++spins) {
    if (done()) return WaitResult::Done;
    if (!pending().empty()) advance_pending();
    if (spins < kPollSpins && (spins & 63) != 0) continue;
    if ((spins & 63) == 0) flight_serve();  // peers diagnosing a timeout ask us
    if (!aborted && poll_abort() != nullptr) {
      aborted = true;
      deadline = std::min(deadline, Clock::now() + kAbortGrace);
    }
    if (Clock::now() > deadline) return aborted ? WaitResult::Aborted : WaitResult::TimedOut;
    if (spins >= kPollSpins) std::this_thread::yield();
  }
}

/// Polls reqs until all complete (done[i] turns 1 as request i does), the deadline
/// passes, or an abort notice arrives. Completed requests become MPI_REQUEST_NULL.
inline WaitResult poll(MPI_Request* reqs, int* done, std::size_t n, Clock::time_point deadline,
                       const char* op, int device) {
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
      deadline);
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
  DISTJAX_THROW(CommError, "[", op, "] timed out after ", timeout.count(), " ms in ", what,
                " on device ", device, ": some device did not arrive");
}

/// Opens the abort channel for a new launch (creating it on first use).
inline void open_epoch(std::chrono::milliseconds timeout, int device) {
  AbortChannel& ch = channel();
  if (ch.comm == MPI_COMM_NULL) {
    check(guarded(timeout,
                  blocked_message("launch", "MPI_Comm_dup(MPI_COMM_WORLD)", device, timeout,
                                  " while starting the MPI backend"),
                  [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &ch.comm); }),
          "launch", device);
    MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && *ub > 0) ch.tag_ub = *ub;
  }
  ch.epoch += 1;
  ch.received = false;
  ch.notice.clear();
  check(MPI_Irecv(ch.buf, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, ch.tag(), ch.comm, &ch.recv),
        "launch", device);
  // The flight recorder's queries share the channel, with tags counted down from the
  // top (notices count up from 1), a pair per epoch.
  flight_open(ch.comm, ch.tag_ub - 2 - 2 * static_cast<int>(ch.epoch % 1000));
}

/// Closes this launch's epoch: withdraws the posted receive. Notices that arrive later
/// (other processes still failing) keep this epoch's tag and are never matched again.
inline void close_epoch() {
  AbortChannel& ch = channel();
  if (ch.recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&ch.recv);
    MPI_Wait(&ch.recv, MPI_STATUS_IGNORE);
  }
  ch.received = false;
  flight_close();
}

/// Tells every other process that this process's device program failed with `what`,
/// unless this process itself learned of a failure from a notice (everyone has it).
inline void send_abort(const std::string& what, int device) {
  AbortChannel& ch = channel();
  if (ch.comm == MPI_COMM_NULL || poll_abort() != nullptr) return;
  ch.sent.push_back(what.substr(0, kNoticeBytes));
  const std::string& buf = ch.sent.back();
  int world = 1;
  MPI_Comm_size(ch.comm, &world);
  for (int p = 0; p < world; ++p) {
    if (p == device) continue;
    MPI_Request r;
    if (MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, p, ch.tag(), ch.comm, &r) ==
        MPI_SUCCESS)
      MPI_Request_free(&r);  // small (eager) message; the buffer stays alive in ch.sent
  }
}

}  // namespace distjax::comm::mpi::guards
