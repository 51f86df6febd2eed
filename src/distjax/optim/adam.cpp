#include "distjax/optim/adam.hpp"

#include "distjax/core/error.hpp"
#include "distjax/optim/detail/leaves.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::optim {

Adam::Adam(AdamConfig config) : config_(std::move(config)) {
  DISTJAX_CHECK(config_.learning_rate, InvalidArgument, "[Adam] learning_rate schedule is empty");
  DISTJAX_CHECK(config_.b1 >= 0.0 && config_.b1 < 1.0 && config_.b2 >= 0.0 && config_.b2 < 1.0,
                InvalidArgument, "[Adam] betas must lie in [0, 1), got b1=", config_.b1,
                " b2=", config_.b2);
}

TensorTree Adam::init(const TensorTree& params) const {
  TensorTree state;
  detail::add_zero_slot(state, "mu", params);
  detail::add_zero_slot(state, "nu", params);
  return state;
}

void Adam::update(TensorTree& params, const TensorTree& grads, TensorTree& state,
                  std::int64_t step) const {
  tensor::NoGradGuard no_grad;
  const double lr = config_.learning_rate(step);
  for (auto& [path, p] : params) {
    if (!detail::trainable(p)) continue;
    const Tensor& g = detail::checked_grad("Adam", path, p, grads);
    const Tensor& m = detail::checked_slot("Adam", "mu", path, p, state);
    const Tensor& v = detail::checked_slot("Adam", "nu", path, p, state);
    detail::adam_kernel(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
                        p.numel(), lr, config_.b1, config_.b2, config_.eps, step + 1, 1.0,
                        config_.weight_decay);
  }
}

}  // namespace distjax::optim
