// Helpers of the comm tests: deterministic inputs per device, host references, and the
// errors of a launch that must fail.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::testing {

/// What a failing launch reported: each device's CommError message ("" if it threw none),
/// by global rank, and the message launch rethrew.
struct Outcome {
  std::vector<std::string> device_msgs;
  std::string launch_msg;
};
inline Outcome run_failing(const LaunchOptions& o, const std::function<void(Communicator&)>& fn) {
  Outcome out;
  out.device_msgs.resize(o.num_devices);
  std::mutex mu;
  try {
    launch(o, [&](Communicator& world) {
      try {
        fn(world);
      } catch (const CommError& e) {
        std::lock_guard lk(mu);
        out.device_msgs[world.global_rank()] = e.what();
        throw;
      }
    });
  } catch (const CommError& e) {
    out.launch_msg = e.what();
  }
  return out;
}

/// Element i of device r's input: values whose f32 sums depend on the order of addition.
inline float input_f32(int r, std::int64_t i) {
  return static_cast<float>((r + 1) * 0.3721 + static_cast<double>(i % 97) * 0.01137 +
                            (i % 7 == 0 ? 1e3 : 0.0) * (r % 2 ? -1 : 1));
}
inline std::int32_t input_i32(int r, std::int64_t i) {
  return static_cast<std::int32_t>(r * 1000003 + i * 7 - 50);
}

/// Element i of device r's f64 input: input_f32 plus a part below f32's precision, so a
/// value that went through f32 (or was reduced as f32) is caught.
inline double input_f64(int r, std::int64_t i) {
  return static_cast<double>(input_f32(r, i)) + (r + 1) * 1.234567e-9 + i * 1e-12;
}

inline std::vector<float> inputs_f32(int r, std::int64_t n) {
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = input_f32(r, i);
  return v;
}
inline std::vector<std::int32_t> inputs_i32(int r, std::int64_t n) {
  std::vector<std::int32_t> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = input_i32(r, i);
  return v;
}

inline std::vector<double> inputs_f64(int r, std::int64_t n) {
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = input_f64(r, i);
  return v;
}

/// Host sum over ranks 0..n-1 in that order (the threads backend's fixed order).
inline std::vector<float> host_sum_f32(const std::vector<int>& ranks, std::int64_t n,
                                       std::int64_t offset = 0) {
  std::vector<float> out(n);
  for (std::int64_t i = 0; i < n; ++i) {
    float acc = input_f32(ranks[0], offset + i);
    for (std::size_t j = 1; j < ranks.size(); ++j) acc += input_f32(ranks[j], offset + i);
    out[i] = acc;
  }
  return out;
}

/// host_sum_f32 of the f64 inputs.
inline std::vector<double> host_sum_f64(const std::vector<int>& ranks, std::int64_t n) {
  std::vector<double> out(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double acc = input_f64(ranks[0], i);
    for (std::size_t j = 1; j < ranks.size(); ++j) acc += input_f64(ranks[j], i);
    out[i] = acc;
  }
  return out;
}

}  // namespace distjax::comm::testing
