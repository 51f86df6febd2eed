// The MPI backend's last resort against hangs (private to src/distjax/comm/mpi): the
// watchdog that aborts a job blocked in a call MPI only has in blocking form, and the
// check of MPI's return codes.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

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
  /// exit_code >= 0: at the deadline the job is aborted with that code, and if MPI_Abort
  /// itself blocks (the launcher cut off), the process ends with it 2 s later (for a call
  /// that may block because the job is already broken).
  std::uint64_t arm(Clock::time_point deadline, std::string what, int exit_code = -1) {
    std::lock_guard<std::mutex> lk(m_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    armed_ = true;
    deadline_ = deadline;
    what_ = std::move(what);
    exit_code_ = exit_code;
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
        abort_job(exit_code_ >= 0 ? exit_code_ : 70, exit_code_ >= 0);
      } else {
        cv_.wait_until(lk, deadline_);
      }
    }
  }

  /// MPI_Abort(code); with `bounded`, the process ends with `code` if it has not returned
  /// within 2 s.
  [[noreturn]] static void abort_job(int code, bool bounded) {
    if (bounded)
      std::thread([code] {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        std::_Exit(code);
      }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  std::mutex m_;
  std::condition_variable cv_;
  bool started_ = false, armed_ = false;
  Clock::time_point deadline_;
  std::string what_;
  int exit_code_ = -1;
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

}  // namespace distjax::comm::mpi::guards
