#include "distjax/nn/initializers.hpp"

#include <cmath>

#include "distjax/core/error.hpp"

namespace distjax::nn {

using tensor::Tensor;

std::int64_t fan_in(const Shape& shape) {
  if (shape.empty()) return 1;
  if (shape.size() == 1) return shape[0];
  return distjax::numel(shape) / shape.back();
}

namespace {
Tensor scaled_draw(const Key& key, const Shape& shape, double stddev, bool truncated) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  const std::int64_t n = t.numel();
  if (truncated) {
    random_truncated_normal(key, p, n);
  } else {
    random_normal(key, p, n);
  }
  const float s = static_cast<float>(stddev);
  for (std::int64_t i = 0; i < n; ++i)
    p[i] *= s;
  return t;
}
}  // namespace

Initializer variance_scaling(double scale) {
  return [scale](const Key& key, const Shape& shape) {
    const std::int64_t fi = fan_in(shape);
    DISTJAX_CHECK(fi > 0, InvalidArgument, "[variance_scaling] fan-in of shape ", to_string(shape),
                  " is zero");
    return scaled_draw(key, shape, std::sqrt(scale / static_cast<double>(fi)), true);
  };
}

Initializer lecun_normal() {
  return variance_scaling(1.0);
}

Initializer normal(double stddev) {
  return [stddev](const Key& key, const Shape& shape) {
    return scaled_draw(key, shape, stddev, false);
  };
}

Initializer truncated_normal(double stddev) {
  return [stddev](const Key& key, const Shape& shape) {
    return scaled_draw(key, shape, stddev, true);
  };
}

Initializer zeros() {
  return [](const Key&, const Shape& shape) { return Tensor::zeros(shape, DType::F32); };
}

Initializer ones() {
  return [](const Key&, const Shape& shape) { return Tensor::ones(shape, DType::F32); };
}

Initializer constant(double value) {
  return [value](const Key&, const Shape& shape) { return Tensor::full(shape, value, DType::F32); };
}

Initializer scaled(Initializer init, double factor) {
  return [init = std::move(init), factor](const Key& key, const Shape& shape) {
    Tensor t = init(key, shape);
    float* p = t.data<float>();
    const float f = static_cast<float>(factor);
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i)
      p[i] *= f;
    return t;
  };
}

}  // namespace distjax::nn
