// Umbrella header: the whole public API of DistJax.
#pragma once

#include "distjax/core/dtype.hpp"
#include "distjax/core/error.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/core/shape.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/autodiff/autodiff.hpp"

namespace distjax {
using tensor::Tensor;
using tensor::TensorTree;
}  // namespace distjax
