// Tensors the op tests draw: normal random values on the current device, and the values a
// reduced-precision tensor holds.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::testing {

/// Standard normal values of `shape` from `seed`, on the current device.
inline tensor::Tensor randn(const Shape& shape, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  random_normal(Key::from_seed(seed), v.data(), numel(shape));
  return tensor::Tensor::from_vector(v, shape);
}

/// x rounded to `dtype` and back to f32.
inline tensor::Tensor rounded(const tensor::Tensor& x, DType dtype) {
  return tensor::astype(tensor::astype(x, dtype), DType::F32);
}

}  // namespace distjax::testing
