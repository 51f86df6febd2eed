#include "distjax/nn/positions.hpp"

#include <cmath>

#include "distjax/core/error.hpp"

namespace distjax::nn {

tensor::Tensor sinusoidal_positions(std::int64_t seq_len, std::int64_t channels) {
  DISTJAX_CHECK(seq_len >= 0 && channels > 0, InvalidArgument,
                "[sinusoidal_positions] expected seq_len >= 0 and channels > 0, got ", seq_len,
                " and ", channels);
  // Computed on the host, then handed to the current device with one copy.
  tensor::Tensor pe = tensor::Tensor::empty({seq_len, channels}, DType::F32, Device::cpu());
  float* p = pe.data<float>();
  for (std::int64_t j = 0; j < channels; ++j) {
    const double even = static_cast<double>(j - (j % 2));
    const double freq = std::pow(10000.0, -even / static_cast<double>(channels));
    for (std::int64_t t = 0; t < seq_len; ++t) {
      const double a = static_cast<double>(t) * freq;
      p[t * channels + j] = static_cast<float>(j % 2 == 0 ? std::sin(a) : std::cos(a));
    }
  }
  return pe.to(current_device());
}

}  // namespace distjax::nn
