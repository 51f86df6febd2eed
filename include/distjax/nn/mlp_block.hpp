// MLPBlock: the transformer feed-forward network, Dense -> GELU -> Dense.
#pragma once

#include <string>

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// x (..., C) -> fc1 Dense(hidden) -> gelu -> fc2 Dense(C) -> (..., C).
/// Parameters: "fc1/kernel" (C, hidden), "fc1/bias", "fc2/kernel" (hidden, C), "fc2/bias".
/// No norm and no residual: TransformerBlock adds those.
struct MLPBlock {
  /// Hidden width; 0 means 4 * C.
  std::int64_t hidden = 0;
  /// GELU in its tanh form (GPT-2, JAX's default) or the erf form.
  bool gelu_approximate = true;
  Initializer kernel_init = lecun_normal();
  /// Initialiser of the output projection fc2 (GPT-2 scales it by 1 / sqrt(2 L)).
  Initializer out_init = lecun_normal();

  /// With a `residual` (..., C): residual + mlp(x), the add in fc2's product.
  Tensor operator()(const Scope& scope, const Tensor& x, const Tensor& residual = Tensor()) const;
};

}  // namespace distjax::nn
