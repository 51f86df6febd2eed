// Private helpers shared by the optimizers: validating a gradient tree against the
// parameters and creating / looking up state slots.
#pragma once

#include <functional>
#include <string>

#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::optim::detail {

using tensor::Tensor;
using tensor::TensorTree;

/// Whether the leaf takes part in optimisation (floating dtype).
inline bool trainable(const Tensor& t) {
  return is_floating(t.dtype());
}

/// Checks that `p` is f32 and that `grads` has an f32 gradient of p's shape at `path`;
/// returns it. `op` names the optimizer in the message.
const Tensor& checked_grad(const char* op, const std::string& path, const Tensor& p,
                           const TensorTree& grads);

/// The f32 state slot "<slot>/<path>" of p's shape; throws naming `op` if absent.
/// (`slot` is a C string: a std::string temporary made at the call would look, to g++ 14's
/// -Wdangling-reference, like what the returned reference points into.)
Tensor& checked_slot(const char* op, const char* slot, const std::string& path, const Tensor& p,
                     TensorTree& state);

/// f32 zeros of every trainable leaf's shape at "<slot>/<path>", merged into `state`.
void add_zero_slot(TensorTree& state, const std::string& slot, const TensorTree& params);

/// Adam's state: zero "mu" and "nu" slots for every trainable leaf.
TensorTree adam_init(const TensorTree& params);

/// The Adam/AdamW update of every trainable leaf of `params`, in place, with grad mode
/// off: moments in state "mu/<path>" and "nu/<path>", bias correction for step + 1,
/// `decay(path)` the decoupled multiplier applied to the parameter first (1 for none),
/// `l2` the coupled L2 coefficient. `op` names the optimizer in errors. Every leaf is
/// checked before any is updated; then the leaves of each device are updated by one
/// multi-leaf kernel call (tensor::detail::adam_update_many_), bit for bit as
/// tensor::adam_update_ would update each.
void adam_update(const char* op, TensorTree& params, const TensorTree& grads, TensorTree& state,
                 std::int64_t step, double lr, double b1, double b2, double eps,
                 const std::function<double(const std::string& path)>& decay, double l2);

}  // namespace distjax::optim::detail
