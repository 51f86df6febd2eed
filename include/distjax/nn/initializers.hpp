// Parameter initialisers: functions (key, shape) -> f32 tensor, as in flax.linen.initializers.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::nn {

/// A block of a global array: per dimension, its first index and its extent.
struct Block {
  std::vector<std::int64_t> start;
  Shape shape;
  /// The whole array.
  static Block whole(const Shape& shape) {
    return Block{std::vector<std::int64_t>(shape.size(), 0), shape};
  }
};

/// Makes a parameter, or one block of it, from a key. Deterministic: the same key and
/// shape give the same values on every run and platform, and a block holds exactly
/// that slice of the whole parameter (random initialisers draw element i of the global
/// array from stream position i), so a device creates only its own shard with the
/// values single-device initialisation gives it.
///
///   Tensor w = lecun_normal()(key, {784, 512});                       // whole
///   Tensor shard = lecun_normal()(key, {784, 512}, {{0, 128}, {784, 128}});  // w[:, 128:256]
class Initializer {
 public:
  /// fill(key, global shape, block, out): writes the block's elements, row-major, to out.
  using Fill = std::function<void(const Key& key, const Shape& global, const Block& block,
                                  float* out)>;

  Initializer() = default;
  explicit Initializer(Fill fill) : fill_(std::move(fill)) {}

  /// The whole parameter, f32 of `shape`.
  tensor::Tensor operator()(const Key& key, const Shape& shape) const;
  /// The block `block` of a parameter of shape `global`, f32 of block.shape. Throws
  /// InvalidArgument when the block does not lie inside `global`.
  tensor::Tensor operator()(const Key& key, const Shape& global, const Block& block) const;
  explicit operator bool() const { return static_cast<bool>(fill_); }

 private:
  Fill fill_;
};

/// Calls fn(global_offset, block_offset, length) for each contiguous row of `block`
/// inside a row-major array of shape `global` (offsets are element indices): the
/// building block of elementwise initialisers.
void for_each_block_row(const Shape& global, const Block& block,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn);

/// Fan-in of a kernel shape: the product of every dimension but the last (Flax's
/// default in_axis=-2 with the receptive field folded in); for a rank-1 shape, its size.
std::int64_t fan_in(const Shape& shape);

/// Truncated normal (to +-2 std) with variance 1 / fan_in: Flax's lecun_normal, the
/// default kernel initialiser of Dense.
Initializer lecun_normal();
/// Truncated normal with variance scale / fan_in (He/LeCun family, mode "fan_in").
Initializer variance_scaling(double scale);
/// Normal with mean 0 and standard deviation `stddev` (GPT-2 uses 0.02).
Initializer normal(double stddev = 1e-2);
/// Truncated normal (to +-2 std) with standard deviation `stddev`.
Initializer truncated_normal(double stddev = 1e-2);
Initializer zeros();
Initializer ones();
Initializer constant(double value);
/// `init` multiplied by `factor` (e.g. residual projections scaled by 1/sqrt(2 L)).
Initializer scaled(Initializer init, double factor);

}  // namespace distjax::nn
