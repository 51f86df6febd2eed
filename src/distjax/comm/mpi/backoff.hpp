// Backoff: how the MPI backend's waits give their core away once a reply is late, so a
// device that waits seconds for a peer costs (almost) no CPU while one that waits
// microseconds never sleeps (private to src/distjax/comm/mpi).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace distjax::comm::mpi {

/// Paces one wait's polls after its first spins: yields for a window (a peer on the same
/// core runs at once, and a reply costs no sleep's latency), then sleeps, the sleeps
/// doubling from kFirstSleep to kMaxSleep. A sleep is never longer than the time already
/// waited, so a wait past its window ends at most about twice as late as its reply came.
/// The window is kYieldFor, longer for a wait on a large transfer (yield_window): MPI
/// moves a message (and a nonblocking collective steps on) only while this process polls,
/// so a sleep in the middle of a transfer would slow it down.
class Backoff {
 public:
  static constexpr std::chrono::microseconds kYieldFor{500};
  static constexpr std::chrono::microseconds kFirstSleep{20};
  static constexpr std::chrono::microseconds kMaxSleep{1000};
  /// The rate a transfer's window assumes: a slow link (250 MB/s, 4 ns per byte).
  static constexpr std::chrono::nanoseconds kPerByte{4};

  /// The window of a wait that moves `bytes` (sent and received).
  static std::chrono::nanoseconds yield_window(std::int64_t bytes) {
    return kYieldFor + kPerByte * std::max<std::int64_t>(bytes, 0);
  }

  explicit Backoff(std::chrono::nanoseconds window = kYieldFor) : window_(window) {}

  /// One pause of a wait that began polling at `start`; `now` is the time of this poll.
  void pause(std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point now) {
    if (now - start < window_) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(2 * sleep_, kMaxSleep);
  }

 private:
  std::chrono::nanoseconds window_;
  std::chrono::microseconds sleep_ = kFirstSleep;
};

}  // namespace distjax::comm::mpi
