#include "distjax/train/strategy.hpp"

#include "distjax/optim/clip.hpp"

namespace distjax::train {

train::GradientResult Strategy::forward_backward(const train::LossFn& loss_fn,
                                                 const TensorTree& params,
                                                 const train::Batch& batch, const Key& key,
                                                 int num_minibatches) {
  return train::accumulate_gradients(loss_fn, params, batch, key, num_minibatches);
}

double Strategy::grad_norm_squared(const TensorTree& grads) {
  return optim::global_norm_squared(grads);
}

TensorTree Strategy::init_opt_state(const optim::Optimizer& optimizer, const TensorTree& params) {
  return optimizer.init(params);
}

void Strategy::apply_update(const optim::Optimizer& optimizer, TensorTree& params,
                            const TensorTree& grads, TensorTree& opt_state, std::int64_t step) {
  optimizer.update(params, grads, opt_state, step);
}

TensorTree Strategy::finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                         TensorTree& params, TensorTree& opt_state,
                                         std::int64_t step) {
  grads = finalize_grads(std::move(grads));
  apply_update(optimizer, params, grads, opt_state, step);
  return grads;
}

TensorTree Strategy::opt_state_to_param_layout(const TensorTree& opt_state, const TensorTree&) {
  return opt_state;
}

TensorTree Strategy::opt_state_from_param_layout(const TensorTree& state, const TensorTree&) {
  return state;
}

}  // namespace distjax::train
