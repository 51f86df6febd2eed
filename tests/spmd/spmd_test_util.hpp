// Helpers shared by the spmd tests: the test meshes, random tensors, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::testing {

using mesh::Mesh;
using tensor::Tensor;

/// The meshes every collective is tested on: 1, 2, 4 and 8 devices, 2-D both ways,
/// 3-D, and a non-power-of-two.
inline std::vector<Mesh> test_meshes() {
  return {Mesh::line(1),
          Mesh::line(2),
          Mesh::line(4),
          Mesh({8}, {"data"}),
          Mesh({2, 4}, {"data", "model"}),
          Mesh({4, 2}, {"data", "model"}),
          Mesh({2, 2, 2}, {"pipe", "data", "model"}),
          Mesh({3, 2}, {"data", "model"})};
}

/// Uniform values in [-1, 1) from `key`, f32.
inline Tensor random_tensor(const Key& key, const distjax::Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(distjax::numel(shape)));
  random_uniform(key, v.data(), static_cast<std::int64_t>(v.size()), -1.f, 1.f);
  return Tensor::from_vector(v, shape);  // filled on the host, then copied to the device
}

/// Max |a - b| over elements; shapes must match (a failure otherwise).
inline void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < va.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(va[i]) - vb[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(vb[i])));
  }
  EXPECT_LE(worst, tol * std::max(1.0, scale)) << what << ": max |diff| " << worst;
}

}  // namespace distjax::testing
