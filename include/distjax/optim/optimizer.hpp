// The optimizer interface: a pure description of an update rule (hyperparameters and
// schedule) acting on a parameter tree, its gradient tree and a state tree.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/optim/schedule.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::optim {

using tensor::Tensor;
using tensor::TensorTree;

/// An optimizer holds no per-parameter data itself: that lives in the state tree
/// returned by `init`, whose paths are "<slot>/<param path>" (e.g. "mu/fc1/kernel") with
/// the parameter's shape, so the state can be sharded exactly like the parameters.
///
///   optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-3)});
///   TensorTree state = opt.init(params);
///   opt.update(params, grads, state, step);   // params and state change in place
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// Fresh state for `params`: f32 zeros per slot for every floating leaf (integer
  /// leaves are not trained). Empty for stateless rules (plain SGD).
  virtual TensorTree init(const TensorTree& params) const = 0;

  /// Applies one update in place on the storage of `params` and `state` (with grad
  /// mode off). `grads` has the paths of `params` (every floating leaf must have a
  /// gradient of the same shape); `step` is the number of updates applied before this
  /// one, so the learning rate is `learning_rate(step)`. Parameters must be f32.
  virtual void update(TensorTree& params, const TensorTree& grads, TensorTree& state,
                      std::int64_t step) const = 0;

  /// The learning rate used by the update at `step`.
  virtual double learning_rate(std::int64_t step) const = 0;

  /// "sgd", "adam", "adamw".
  virtual std::string name() const = 0;

  /// Whether `update` acts on each leaf alone (what it does to a leaf depends on that
  /// leaf's parameter, gradient and state only), so the tree may be updated in parts at
  /// different times with the same result: a data-parallel step then updates each
  /// gradient bucket as soon as its all-reduce is done. The built-in rules do; a rule
  /// with a global view (a norm over all leaves) must keep the default, false.
  virtual bool updates_per_leaf() const { return false; }
};

}  // namespace distjax::optim
