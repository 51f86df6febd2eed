// RMSNorm: root-mean-square normalisation over the last dimension with a learned scale.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// x / sqrt(mean(x^2) + eps) * scale over the last dimension.
///  x (..., C) -> (..., C). Parameter: "scale" (C) = 1.
struct RMSNorm {
  float eps = 1e-6f;

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
