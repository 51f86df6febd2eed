// TrainState: everything a training run carries from one step to the next.
#pragma once

#include <cstdint>
#include <optional>

#include "distjax/core/prng.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/train/loss_scale.hpp"

namespace distjax::train {

class Strategy;  // train/strategy.hpp

using tensor::TensorTree;

/// Step counter, parameters, optimizer state (same paths as the parameters under a
/// slot prefix) and the base PRNG key; the key of step s is rng.fold_in(s).
struct TrainState {
  std::int64_t step = 0;
  TensorTree params;
  TensorTree opt_state;
  Key rng;
  /// The dynamic loss scale of f16 training (train/loss_scale.hpp); none: the loss is not
  /// scaled (f32 and bf16 training).
  std::optional<DynamicLossScale> loss_scale;

  /// A state at step 0 with the optimizer's fresh state for `params`.
  static TrainState create(TensorTree params, const optim::Optimizer& optimizer, Key rng);
  /// The same with the state `strategy` keeps (ZeRO: this device's shard of it).
  static TrainState create(TensorTree params, const optim::Optimizer& optimizer, Key rng,
                           train::Strategy& strategy);
};

}  // namespace distjax::train
