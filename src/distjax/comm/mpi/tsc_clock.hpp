// TscClock: steady_clock's time from the CPU's time-stamp counter, for the per-call
// timing of the small all-reduce, where two steady_clock::now() calls (clock_gettime,
// 24 ns each on the 2-core VM here, against 10 ns for the counter) are a sixth of a
// 4-byte all-reduce.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace distjax::comm::mpi {

/// Time points of steady_clock read from the time-stamp counter where the kernel keeps
/// its own time with it (clocksource "tsc": the counter is invariant and synchronised
/// across cores, as the kernel checked); elsewhere steady_clock itself. Each clock is
/// anchored to steady_clock (anchor()); between anchors it runs at the rate measured once
/// per process against steady_clock (over 2 ms, to about 1e-5), so a time read t after
/// the last anchor is off by about 1e-5 t. Callers re-anchor often (the MPI backend's
/// small all-reduce: at every look for an abort notice, at most 100 us apart in a stream
/// of calls).
class TscClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// The first clock of a process measures the rate (2 ms).
  TscClock() {
    (void)rate();
    anchor();
  }

  /// steady_clock::now(), made the new anchor.
  time_point anchor() {
    base_ = std::chrono::steady_clock::now();
    base_tick_ = ticks();
    return base_;
  }

  time_point now() const {
    const double ns = rate();
    if (ns == 0.0) return std::chrono::steady_clock::now();
    const double elapsed = static_cast<double>(ticks() - base_tick_) * ns;
    return base_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double, std::nano>(elapsed));
  }

 private:
  static std::uint64_t ticks() {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return 0;
#endif
  }

  /// Nanoseconds per tick; 0 where the counter is not the kernel's clocksource.
  static double rate() {
    static const double ns_per_tick = [] {
#if defined(__x86_64__)
      std::string source;
      std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
      if (source != "tsc") return 0.0;
      const auto t0 = std::chrono::steady_clock::now();
      const std::uint64_t k0 = ticks();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const auto t1 = std::chrono::steady_clock::now();
      const std::uint64_t k1 = ticks();
      if (k1 > k0)
        return std::chrono::duration<double, std::nano>(t1 - t0).count() /
               static_cast<double>(k1 - k0);
#endif
      return 0.0;
    }();
    return ns_per_tick;
  }

  time_point base_{};
  std::uint64_t base_tick_ = 0;
};

}  // namespace distjax::comm::mpi
