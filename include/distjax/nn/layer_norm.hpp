// LayerNorm: normalisation over the last dimension with a learned scale and bias.
#pragma once

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// (x - mean) / sqrt(var + eps) * scale + bias over the last dimension.
///  x (..., C) -> (..., C). Parameters: "scale" (C) = 1, "bias" (C) = 0.
struct LayerNorm {
  float eps = 1e-5f;
  bool use_bias = true;
  /// The output in the scope's compute dtype (Precision::compute_dtype), for a norm whose
  /// output only feeds matmuls, which read it so: the same bits as their cast, in one pass
  /// where the device has a bf16-writing kernel (tensor::layer_norm's `out`).
  bool to_compute = false;

  Tensor operator()(const Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::nn
