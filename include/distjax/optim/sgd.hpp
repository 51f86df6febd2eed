// Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay,
// with PyTorch's torch.optim.SGD semantics (dampening 0).
#pragma once

#include "distjax/optim/optimizer.hpp"

namespace distjax::optim {

/// Hyperparameters of SGD.
struct SGDConfig {
  Schedule learning_rate = constant_schedule(0.01);
  double momentum = 0.0;      ///< 0 disables the momentum buffer (and its state slot)
  bool nesterov = false;      ///< requires momentum > 0
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient: g += wd * p
};

/// SGD. Per leaf, with g = grad + wd * p:
///   buf = momentum * buf + g                      (state slot "momentum/<path>")
///   d   = nesterov ? g + momentum * buf : buf     (d = g without momentum)
///   p  -= lr * d
class SGD : public Optimizer {
 public:
  explicit SGD(SGDConfig config);
  TensorTree init(const TensorTree& params) const override;
  void update(TensorTree& params, const TensorTree& grads, TensorTree& state,
              std::int64_t step) const override;
  double learning_rate(std::int64_t step) const override { return config_.learning_rate(step); }
  std::string name() const override { return "sgd"; }
  bool updates_per_leaf() const override { return true; }
  const SGDConfig& config() const { return config_; }

 private:
  SGDConfig config_;
};

}  // namespace distjax::optim
