// Dense: the fully connected layer y = x @ kernel + bias.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// Fully connected layer over the last dimension.
///  x (..., K) f32 -> (..., features). Parameters: "kernel" (K, features), "bias" (features).
///
///   Tensor h = Dense{.features = 512}(scope.child("fc1"), x);
struct Dense {
  std::int64_t features = 0;
  bool use_bias = true;
  Initializer kernel_init = lecun_normal();
  Initializer bias_init = zeros();
  /// Sharding metadata recorded at init (empty = replicated), e.g. {"", "model"} for a
  /// column-parallel kernel.
  AxisNames kernel_axes{};
  AxisNames bias_axes{};

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
