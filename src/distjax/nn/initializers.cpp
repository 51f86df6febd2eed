#include "distjax/nn/initializers.hpp"

#include <algorithm>
#include <cmath>

#include "distjax/core/error.hpp"

namespace distjax::nn {

using tensor::Tensor;

std::int64_t fan_in(const Shape& shape) {
  if (shape.empty()) return 1;
  if (shape.size() == 1) return shape[0];
  return distjax::numel(shape) / shape.back();
}

Tensor Initializer::operator()(const Key& key, const Shape& shape) const {
  return (*this)(key, shape, Block::whole(shape));
}

Tensor Initializer::operator()(const Key& key, const Shape& global, const Block& block) const {
  DISTJAX_CHECK(fill_, InvalidArgument, "[Initializer] called on an empty initializer");
  bool inside = block.start.size() == global.size() && block.shape.size() == global.size();
  for (std::size_t d = 0; inside && d < global.size(); ++d)
    inside =
        block.start[d] >= 0 && block.shape[d] >= 0 && block.start[d] + block.shape[d] <= global[d];
  DISTJAX_CHECK(inside, InvalidArgument, "[Initializer] block of shape ", to_string(block.shape),
                " does not lie inside the parameter of shape ", to_string(global));
  // Fills write host memory; the block goes to the current device with one copy.
  Tensor t = Tensor::empty(block.shape, DType::F32, Device::cpu());
  fill_(key, global, block, t.data<float>());
  return t.to(current_device());
}

void for_each_block_row(const Shape& global, const Block& block,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn) {
  const std::size_t rank = global.size();
  if (rank == 0) {
    fn(0, 0, 1);
    return;
  }
  if (distjax::numel(block.shape) == 0) return;
  const std::int64_t row = block.shape[rank - 1];
  const std::int64_t rows = distjax::numel(block.shape) / row;
  for (std::int64_t r = 0; r < rows; ++r) {
    // Global offset of the row's first element: the block row index r decomposed over
    // the leading block dimensions, shifted by the block's start.
    std::int64_t g = 0, stride = global[rank - 1], rem = r;
    for (std::size_t d = rank - 1; d-- > 0;) {
      g += (block.start[d] + rem % block.shape[d]) * stride;
      rem /= block.shape[d];
      stride *= global[d];
    }
    fn(g + block.start[rank - 1], r * row, row);
  }
}

namespace {

Initializer scaled_draw(double stddev, bool truncated,
                        std::function<double(const Shape&)> std_of_shape = nullptr) {
  return Initializer([=](const Key& key, const Shape& global, const Block& block, float* out) {
    const float s = static_cast<float>(std_of_shape ? std_of_shape(global) : stddev);
    for_each_block_row(global, block, [&](std::int64_t g, std::int64_t local, std::int64_t n) {
      float* p = out + local;
      if (truncated) {
        random_truncated_normal(key, p, n, g);
      } else {
        random_normal(key, p, n, g);
      }
      for (std::int64_t i = 0; i < n; ++i)
        p[i] *= s;
    });
  });
}

Initializer filled(float value) {
  return Initializer([value](const Key&, const Shape&, const Block& block, float* out) {
    std::fill(out, out + distjax::numel(block.shape), value);
  });
}

}  // namespace

Initializer variance_scaling(double scale) {
  return scaled_draw(0.0, true, [scale](const Shape& shape) {
    const std::int64_t fi = fan_in(shape);
    DISTJAX_CHECK(fi > 0, InvalidArgument, "[variance_scaling] fan-in of shape ", to_string(shape),
                  " is zero");
    return std::sqrt(scale / static_cast<double>(fi));
  });
}

Initializer lecun_normal() {
  return variance_scaling(1.0);
}

Initializer normal(double stddev) {
  return scaled_draw(stddev, false);
}

Initializer truncated_normal(double stddev) {
  return scaled_draw(stddev, true);
}

Initializer zeros() {
  return filled(0.f);
}

Initializer ones() {
  return filled(1.f);
}

Initializer constant(double value) {
  return filled(static_cast<float>(value));
}

Initializer scaled(Initializer init, double factor) {
  return Initializer([init = std::move(init), factor](const Key& key, const Shape& global,
                                                      const Block& block, float* out) {
    Tensor t = [&] {
      DeviceScope host(Device::cpu());  // the inner draw on the host: no copy to and fro
      return init(key, global, block);
    }();
    const float* src = t.data<float>();
    const float f = static_cast<float>(factor);
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i)
      out[i] = src[i] * f;
  });
}

}  // namespace distjax::nn
