// Shape ops: reshape, transpose/permute, slice, concat, split, stack, broadcast_to.
// All are differentiable and return contiguous tensors.
#pragma once

#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// Same elements, new shape; one entry may be -1 (inferred).
Tensor reshape(const Tensor& x, const Shape& shape);
/// Swaps dimensions `d0` and `d1` (default: the last two).
Tensor transpose(const Tensor& x, int d0 = -2, int d1 = -1);
/// Reorders dimensions: out.shape[i] = x.shape[perm[i]].
Tensor permute(const Tensor& x, const std::vector<int>& perm);
/// Elements [start, end) along `axis` (negative indices count from the end).
Tensor slice(const Tensor& x, int axis, std::int64_t start, std::int64_t end);
/// Joins tensors of equal shape except along `axis`.
Tensor concat(const std::vector<Tensor>& xs, int axis);
/// Copies of the rows of `x` (dimension 0) at `indices`, in their order (a data set's
/// batch of examples); not differentiated.
Tensor gather_rows(const Tensor& x, const std::vector<std::int64_t>& indices);
/// Splits into `sizes` along `axis` (sizes sum to the dimension).
std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, int axis);
/// Splits into `n` equal parts along `axis`.
std::vector<Tensor> split(const Tensor& x, int n, int axis);
/// Stacks tensors of equal shape along a new dimension `axis`.
Tensor stack(const std::vector<Tensor>& xs, int axis = 0);
/// Broadcasts to `shape` (NumPy rules).
Tensor broadcast_to(const Tensor& x, const Shape& shape);

}  // namespace distjax::tensor
