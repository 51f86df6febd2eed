// Private helpers: dtype conversion, fill and element loads for any dtype.
#pragma once

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor::detail {

/// Converts every element of `src` into `dst` (same numel, any dtypes).
void convert(const Tensor& src, Tensor& dst);
/// Sets every element of `t` to `value` converted to t's dtype.
void fill(Tensor& t, double value);
/// Element `i` (flat index) of any dtype as double.
double load_as_double(const Tensor& t, std::int64_t i);

}  // namespace distjax::tensor::detail
