#include "distjax/optim/sgd.hpp"

#include "distjax/core/error.hpp"
#include "distjax/optim/detail/leaves.hpp"
#include "distjax/tensor/update_ops.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::optim {

SGD::SGD(SGDConfig config) : config_(std::move(config)) {
  DISTJAX_CHECK(config_.learning_rate, InvalidArgument, "[SGD] learning_rate schedule is empty");
  DISTJAX_CHECK(config_.momentum >= 0.0, InvalidArgument, "[SGD] momentum must be >= 0, got ",
                config_.momentum);
  DISTJAX_CHECK(!config_.nesterov || config_.momentum > 0.0, InvalidArgument,
                "[SGD] nesterov needs momentum > 0");
}

TensorTree SGD::init(const TensorTree& params) const {
  TensorTree state;
  if (config_.momentum > 0.0) detail::add_zero_slot(state, "momentum", params);
  return state;
}

void SGD::update(TensorTree& params, const TensorTree& grads, TensorTree& state,
                 std::int64_t step) const {
  tensor::NoGradGuard no_grad;
  const tensor::SGDStep coefficients{.lr = static_cast<float>(config_.learning_rate(step)),
                                     .momentum = static_cast<float>(config_.momentum),
                                     .weight_decay = static_cast<float>(config_.weight_decay),
                                     .nesterov = config_.nesterov};
  // Every leaf checked first, then one multi-leaf kernel call per device (the same bits as
  // tensor::sgd_update_ on each leaf).
  std::vector<tensor::UpdateLeaf> leaves;
  for (auto& [path, p] : params) {
    if (!detail::trainable(p)) continue;
    const Tensor& g = detail::checked_grad("SGD", path, p, grads);
    // No buffer without momentum (init() made none).
    Tensor* buf = config_.momentum == 0.0
                      ? nullptr
                      : &detail::checked_slot("SGD", "momentum", path, p, state);
    leaves.push_back({.param = &p, .grad = &g, .m = buf});
  }
  tensor::sgd_update_many_(leaves, coefficients);
}

}  // namespace distjax::optim
