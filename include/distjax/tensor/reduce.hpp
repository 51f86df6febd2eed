// Reductions over axes: sum, mean, max (differentiable), argmax (not), and sum_to,
// which undoes broadcasting in backward passes.
#pragma once

#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// Sum of all elements: a scalar (rank 0).
Tensor sum(const Tensor& x);
/// Sum over `axes` (negative allowed); keeps them as size 1 when keepdims.
Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
/// Maximum over `axes`; the gradient goes to the first maximal element.
Tensor max(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor max(const Tensor& x);
/// Index of the maximum along `axis` (i64, not differentiable).
Tensor argmax(const Tensor& x, int axis = -1);
/// Sums `x` down to `shape`, the inverse of broadcasting `shape` up to x.shape().
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace distjax::tensor
