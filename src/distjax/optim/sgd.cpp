#include "distjax/optim/sgd.hpp"

#include "distjax/core/error.hpp"
#include "distjax/optim/detail/leaves.hpp"
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
  const float lr = static_cast<float>(config_.learning_rate(step));
  const float mu = static_cast<float>(config_.momentum);
  const float wd = static_cast<float>(config_.weight_decay);
  const bool nesterov = config_.nesterov;
  for (auto& [path, p] : params) {
    if (!detail::trainable(p)) continue;
    const Tensor& g = detail::checked_grad("SGD", path, p, grads);
    float* __restrict pp = p.data<float>();
    const float* __restrict gp = g.data<float>();
    const std::int64_t n = p.numel();
    if (config_.momentum == 0.0) {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i)
        pp[i] -= lr * (gp[i] + wd * pp[i]);
      continue;
    }
    float* __restrict buf = detail::checked_slot("SGD", "momentum", path, p, state).data<float>();
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = gp[i] + wd * pp[i];
      const float bi = mu * buf[i] + gi;
      buf[i] = bi;
      pp[i] -= lr * (nesterov ? gi + mu * bi : bi);
    }
  }
}

}  // namespace distjax::optim
