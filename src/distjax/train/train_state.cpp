#include "distjax/train/train_state.hpp"

namespace distjax::train {

TrainState TrainState::create(TensorTree params, const optim::Optimizer& optimizer, Key rng) {
  TrainState s;
  s.opt_state = optimizer.init(params);
  s.params = std::move(params);
  s.rng = rng;
  return s;
}

}  // namespace distjax::train
