// Private helpers over the copy kernels: dtype conversion and fill of whole tensors.
#pragma once

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor::detail {

/// Converts every element of `src` into `dst` (same numel, any dtypes, one device).
void convert(const Tensor& src, Tensor& dst);
/// Sets every element of `t` to `value` converted to t's dtype.
void fill(Tensor& t, double value);

}  // namespace distjax::tensor::detail
