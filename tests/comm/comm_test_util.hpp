// Helpers of the comm tests: deterministic inputs per device and host references.
#pragma once

#include <cstdint>
#include <vector>

namespace distjax::comm::testing {

/// Element i of device r's input: values whose f32 sums depend on the order of addition.
inline float input_f32(int r, std::int64_t i) {
  return static_cast<float>((r + 1) * 0.3721 + static_cast<double>(i % 97) * 0.01137 +
                            (i % 7 == 0 ? 1e3 : 0.0) * (r % 2 ? -1 : 1));
}
inline std::int32_t input_i32(int r, std::int64_t i) {
  return static_cast<std::int32_t>(r * 1000003 + i * 7 - 50);
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

}  // namespace distjax::comm::testing
