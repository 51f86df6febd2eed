// Classifier: the MLP image classifier of the DistJax examples,
// Dense(hidden) -> silu -> dropout -> Dense(num_classes).
// Shape legend: B batch, F input features, K classes.
#pragma once

#include <cstdint>
#include <utility>

#include "distjax/core/prng.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

struct ClassifierConfig {
  std::int64_t in_features = 784;  // F
  std::int64_t hidden = 512;
  std::int64_t num_classes = 10;  // K
  float dropout = 0.1f;
};

/// x (B, F) f32 -> logits (B, K) f32. Parameters: "fc1/kernel" (F, hidden), "fc1/bias",
/// "fc2/kernel" (hidden, K), "fc2/bias". Dropout draws from the "dropout" scope.
///
///   models::Classifier model(cfg);
///   TensorTree params = model.init(Key::from_seed(0));
///   Tensor logits = model.apply(params, x, /*train=*/true, step_key);
class Classifier {
 public:
  explicit Classifier(ClassifierConfig config = {});

  /// Fresh parameters; the same key gives identical parameters on every run.
  TensorTree init(Key key) const;
  /// Inside shard_map: this device's parameters, fully sharded (ZeRO-3) when `fsdp` is
  /// given (apply them on a scope with the same configuration); the PartitionSpec of
  /// every sharded parameter goes into `*specs` when given.
  TensorTree init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                  const nn::FullySharded* fsdp = nullptr) const;
  /// Logits of a batch; dropout is active only when `train` (masks from dropout_key).
  Tensor apply(const TensorTree& params, const Tensor& x, bool train, Key dropout_key) const;
  /// The same forward on any scope (to nest the classifier in a bigger module).
  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;

  /// Number of parameters the config gives.
  std::int64_t num_params() const;
  /// Forward + backward FLOPs per example (6 per multiply-add weight).
  double flops_per_example() const { return 6.0 * static_cast<double>(num_params()); }

  const ClassifierConfig& config() const { return config_; }

 private:
  ClassifierConfig config_;
};

/// Mean cross-entropy of logits (B, K) against i32 labels (B), with "accuracy" as
/// (rows where argmax == label, B): the loss of the classifiers.
std::pair<Tensor, train::Metrics> classification_loss(const Tensor& logits, const Tensor& labels);

}  // namespace distjax::models
