// Adam (Kingma & Ba) with bias correction and optional coupled L2 weight decay, with
// PyTorch's torch.optim.Adam semantics.
#pragma once

#include "distjax/optim/optimizer.hpp"

namespace distjax::optim {

/// Hyperparameters of Adam.
struct AdamConfig {
  Schedule learning_rate = constant_schedule(1e-3);
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  ///< coupled L2: g += wd * p before the moments
};

/// Adam. Per leaf at update t = step + 1, with g = grad + wd * p:
///   m = b1 m + (1 - b1) g          (state slot "mu/<path>")
///   v = b2 v + (1 - b2) g^2        (state slot "nu/<path>")
///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class Adam : public Optimizer {
 public:
  explicit Adam(AdamConfig config);
  TensorTree init(const TensorTree& params) const override;
  void update(TensorTree& params, const TensorTree& grads, TensorTree& state,
              std::int64_t step) const override;
  double learning_rate(std::int64_t step) const override { return config_.learning_rate(step); }
  std::string name() const override { return "adam"; }
  bool updates_per_leaf() const override { return true; }
  const AdamConfig& config() const { return config_; }

 private:
  AdamConfig config_;
};

}  // namespace distjax::optim
