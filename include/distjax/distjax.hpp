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
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/mesh/sharded_array.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/embedding.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/nn/multi_head_attention.hpp"
#include "distjax/nn/positions.hpp"
#include "distjax/nn/rms_norm.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/nn/transformer_block.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"

namespace distjax {
using tensor::Tensor;
using tensor::TensorTree;
}  // namespace distjax
