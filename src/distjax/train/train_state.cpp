#include "distjax/train/train_state.hpp"

#include "distjax/train/strategy.hpp"

namespace distjax::train {

TrainState TrainState::create(TensorTree params, const optim::Optimizer& optimizer, Key rng) {
  TrainState s;
  s.opt_state = optimizer.init(params);
  s.params = std::move(params);
  s.rng = rng;
  return s;
}

TrainState TrainState::create(TensorTree params, const optim::Optimizer& optimizer, Key rng,
                              train::Strategy& strategy) {
  TrainState s;
  s.opt_state = strategy.init_opt_state(optimizer, params);
  s.params = std::move(params);
  s.rng = rng;
  return s;
}

}  // namespace distjax::train
