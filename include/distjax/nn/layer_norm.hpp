// LayerNorm: normalisation over the last dimension with a learned scale and bias.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// (x - mean) / sqrt(var + eps) * scale + bias over the last dimension.
///  x (..., C) -> (..., C). Parameters: "scale" (C) = 1, "bias" (C) = 0.
struct LayerNorm {
  float eps = 1e-5f;
  bool use_bias = true;

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
