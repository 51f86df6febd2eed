// The multi-leaf forms of the update ops (tensor/update_ops.hpp), for the optimizers: one
// kernel call per device for all of a tree's leaves, which a GPU runs in a few launches
// instead of one per leaf. The same bits as the per-leaf ops.
#pragma once

#include <span>

#include "distjax/tensor/update_ops.hpp"

namespace distjax::tensor::detail {

/// One leaf of a multi-leaf update: param, grad and the state tensors it uses, f32 of one
/// shape on one device (leaves may sit on different devices).
struct UpdateLeaf {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* m = nullptr;  ///< Adam's first moment, or SGD's momentum buffer (null for none)
  Tensor* v = nullptr;  ///< Adam's second moment
  double decay = 1.0;   ///< Adam's decoupled multiplier for this leaf (AdamStep::decay unused)
};

/// sgd_update_ on every leaf (with its buffer `m` where set): every leaf is checked first,
/// then the leaves of each device (with a buffer or without) go to one sgd_many or
/// sgd_momentum_many kernel call, or leaf by leaf where their parameters share memory.
void sgd_update_many_(std::span<const UpdateLeaf> leaves, const SGDStep& step);

/// adam_update_ on every leaf, each with its own decay: every leaf is checked first, then
/// the leaves of each device go to one adam_many kernel call, or leaf by leaf where their
/// parameters share memory.
void adam_update_many_(std::span<const UpdateLeaf> leaves, const AdamStep& step);

}  // namespace distjax::tensor::detail
