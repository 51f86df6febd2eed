// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, optionally masked by
// parameter path (e.g. no decay on biases and normalisation scales).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distjax/optim/optimizer.hpp"

namespace distjax::optim {

/// Whether weight decay applies to the leaf at `path`.
using DecayMask = std::function<bool(const std::string& path)>;

/// A mask that decays every leaf except those whose last path component is one of
/// `names` or whose path contains one of `substrings`.
///
///   // no decay on ".../bias", ".../scale" or anything under a "ln_*" / "norm" module
///   DecayMask m = decay_mask_excluding({"bias", "scale"}, {"norm", "ln"});
DecayMask decay_mask_excluding(std::vector<std::string> names,
                               std::vector<std::string> substrings = {});

/// The usual mask: no decay on leaves named "bias", "b", "scale", "gamma", "beta", nor
/// on any path with a component containing "norm" or starting with "ln".
DecayMask default_decay_mask();

/// Hyperparameters of AdamW.
struct AdamWConfig {
  Schedule learning_rate = constant_schedule(1e-3);
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  /// Which leaves are decayed; empty = all of them.
  DecayMask decay_mask = {};
};

/// AdamW. Per leaf at update t = step + 1 (torch.optim.AdamW; optax.adamw):
///   p *= 1 - lr * wd                 (only where decay_mask(path))
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2     (slots "mu/", "nu/")
///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class AdamW : public Optimizer {
 public:
  explicit AdamW(AdamWConfig config);
  TensorTree init(const TensorTree& params) const override;
  void update(TensorTree& params, const TensorTree& grads, TensorTree& state,
              std::int64_t step) const override;
  double learning_rate(std::int64_t step) const override { return config_.learning_rate(step); }
  std::string name() const override { return "adamw"; }
  bool updates_per_leaf() const override { return true; }
  const AdamWConfig& config() const { return config_; }
  /// Whether the leaf at `path` is decayed.
  bool decays(const std::string& path) const;

 private:
  AdamWConfig config_;
};

}  // namespace distjax::optim
