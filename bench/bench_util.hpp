// Shared helpers of the DistJax benchmarks: timing (warm-up, repetitions, median),
// the measured FP32 peak of this machine, and the JSONL writer behind
// bench/results/latest.jsonl (the file named by env DISTJAX_BENCH_OUT).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <time.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace distjax::bench {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Per-call times (seconds) of `fn`: `warmup` untimed calls, then repetitions of
/// `inner` calls each until `min_total` seconds and at least `min_reps` repetitions.
/// Each entry is the mean call time of one repetition.
inline std::vector<double> time_calls(const std::function<void()>& fn, int warmup, int inner,
                                      double min_total, int min_reps, int max_reps = 100000) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> out;
  const auto start = Clock::now();
  while (static_cast<int>(out.size()) < max_reps &&
         (static_cast<int>(out.size()) < min_reps || seconds_since(start) < min_total)) {
    const auto t0 = Clock::now();
    for (int i = 0; i < inner; ++i) fn();
    out.push_back(seconds_since(t0) / inner);
  }
  return out;
}

/// CPU seconds the calling thread has run.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Runs `command` (a reference program in another language: its stderr joined to its
/// stdout) and returns the last line of its output that is a JSON object holding `key`;
/// otherwise {"error": the start of its output}, for the bench line's reason.
inline nlohmann::json reference_result(const std::string& command, const std::string& key) {
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {{"error", "could not start: " + command}};
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  pclose(pipe);
  nlohmann::json found;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    if (text[at] == '{') {
      nlohmann::json j = nlohmann::json::parse(text.substr(at, end - at), nullptr, false);
      if (j.is_object() && j.contains(key)) found = std::move(j);
    }
    at = end + 1;
  }
  if (found.is_object()) return found;
  return {{"error", text.substr(0, 2000)}};
}

inline double minimum(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

// ------------------------------------------------------------------ measured peak

/// One thread's FMA loop: 16 independent 512-bit accumulators (enough to cover the
/// FMA latency on two pipes), `iters` iterations of 16 FMAs = 512 flops each.
__attribute__((target("avx512f"), noinline)) inline float fma_loop_avx512(long iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0.f;
  for (float v : lanes) total += v;
  return total;
}

inline bool cpu_has_avx512f() { return __builtin_cpu_supports("avx512f"); }

/// Measured FP32 peak in GFLOP/s on `threads` threads (each running the FMA loop): the
/// best of many short repetitions (~1 ms each) over `seconds`, so that on a machine
/// shared with other processes some repetitions run undisturbed. 0 without AVX-512.
inline double measure_peak_gflops(int threads, double seconds = 0.5) {
  if (!cpu_has_avx512f()) return 0.0;
  constexpr long iters = 200'000;  // 0.1024 GFLOP per thread per repetition
  volatile float sink = 0.f;
  fma_loop_avx512(iters);  // warm up (clock ramp, AVX-512 licence)
  double best = 0.0;
  const auto start = Clock::now();
  int reps = 0;
  while (reps < 5 || seconds_since(start) < seconds) {
    std::vector<std::thread> pool;
    std::vector<float> res(threads);
    const auto t0 = Clock::now();
    for (int t = 1; t < threads; ++t)
      pool.emplace_back([&res, t] { res[t] = fma_loop_avx512(iters); });
    res[0] = fma_loop_avx512(iters);
    for (auto& th : pool) th.join();
    const double dt = seconds_since(t0);
    for (float r : res) sink = sink + r;
    best = std::max(best, 512.0 * iters * threads / dt * 1e-9);
    ++reps;
  }
  (void)sink;
  return best;
}

// ------------------------------------------------------------------ output

/// Appends JSON lines to the file named by DISTJAX_BENCH_OUT (if set) and echoes
/// a readable line to stdout.
class Writer {
 public:
  Writer() {
    if (const char* p = std::getenv("DISTJAX_BENCH_OUT"); p && *p) path_ = p;
  }
  void write(json j) {
    // bench/run.sh repeats some runs in rounds; each line says which.
    if (const char* r = std::getenv("DISTJAX_BENCH_ROUND"); r && *r && !j.contains("round"))
      j["round"] = std::atoi(r);
    if (!path_.empty()) {
      std::ofstream f(path_, std::ios::app);
      f << j.dump() << '\n';
    }
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }

 private:
  std::string path_;
};

/// A measurement line: name, value, unit.
inline json line(const std::string& name, double value, const std::string& unit) {
  return json{{"name", name}, {"value", value}, {"unit", unit}};
}

/// Adds the comparison fields. `ratio` = ours / baseline when higher is better
/// (throughput), baseline / ours when lower is better (time): > 1 means DistJax is better.
inline void compare(json& j, const std::string& baseline, double baseline_value, bool higher_is_better) {
  const double v = j["value"].get<double>();
  j["baseline"] = baseline;
  j["baseline_value"] = baseline_value;
  j["better"] = higher_is_better ? "higher" : "lower";
  double r = 0.0;
  if (higher_is_better && baseline_value > 0) r = v / baseline_value;
  if (!higher_is_better && v > 0) r = baseline_value / v;
  j["ratio"] = r;
}

}  // namespace distjax::bench
