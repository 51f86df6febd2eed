#include "distjax/optim/adam.hpp"

#include "distjax/core/error.hpp"
#include "distjax/optim/detail/leaves.hpp"

namespace distjax::optim {

Adam::Adam(AdamConfig config) : config_(std::move(config)) {
  DISTJAX_CHECK(config_.learning_rate, InvalidArgument, "[Adam] learning_rate schedule is empty");
  DISTJAX_CHECK(config_.b1 >= 0.0 && config_.b1 < 1.0 && config_.b2 >= 0.0 && config_.b2 < 1.0,
                InvalidArgument, "[Adam] betas must lie in [0, 1), got b1=", config_.b1,
                " b2=", config_.b2);
}

TensorTree Adam::init(const TensorTree& params) const {
  return detail::adam_init(params);
}

void Adam::update(TensorTree& params, const TensorTree& grads, TensorTree& state,
                  std::int64_t step) const {
  detail::adam_update(
      "Adam", params, grads, state, step, config_.learning_rate(step), config_.b1, config_.b2,
      config_.eps, [](const std::string&) { return 1.0; }, config_.weight_decay);
}

}  // namespace distjax::optim
