// Parameter initialisers: functions (key, shape) -> f32 tensor, as in flax.linen.initializers.
#pragma once

#include <functional>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::nn {

/// Makes a parameter of the given shape from a key. Deterministic: the same key and
/// shape give the same values on every run and platform.
using Initializer = std::function<tensor::Tensor(const Key& key, const Shape& shape)>;

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
