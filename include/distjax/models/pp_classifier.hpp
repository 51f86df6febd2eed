// PPClassifier: the pipeline-parallel MLP classifier of the DistJax examples, an input
// Dense on the first stage, residual MLP blocks cut into chunks over the pipe axis, and
// LayerNorm + Dense + cross-entropy on the last stage.
// Shape legend: B batch, F input features, H hidden, K classes.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/parallel/pipeline.hpp"
#include "distjax/train/loss.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

struct PPClassifierConfig {
  std::int64_t in_features = 784;  // F
  std::int64_t hidden = 256;       // H
  std::int64_t num_layers = 4;     // residual MLP blocks, cut over the chunks
  std::int64_t mlp_expansion = 2;  // block hidden = mlp_expansion * H
  std::int64_t num_classes = 10;   // K
  float dropout = 0.f;
  /// Blocks per chunk (empty: balanced, parallel::partition_layers).
  std::vector<int> layers_per_chunk{};
};

/// x (B, F) f32 -> "input" Dense(H) -> blocks/i: x + fc2(dropout(silu(fc1(LayerNorm(x)))))
/// -> "out_norm" LayerNorm -> "head" Dense(K) -> logits (B, K). Labels (B) i32. Chunk 0
/// holds "input", the last chunk "out_norm" and "head"; the activation between chunks is
/// (b, H). The loss is the mean cross-entropy, with "accuracy" as a metric.
///
///   models::PPClassifier model(cfg);
///   TensorTree all = model.init(Key::from_seed(0));                 // one device
///   parallel::Pipeline pp(ctx, model, {.microbatches = 8});
///   TensorTree mine = model.init(Key::from_seed(0), pp.chunks(), pp.num_chunks());
class PPClassifier final : public parallel::PipelineModule {
 public:
  explicit PPClassifier(PPClassifierConfig config = {});

  /// The whole model on one device: parameters and the loss function of a train step.
  TensorTree init(Key key) const;
  train::LossFn loss_fn() const;
  Tensor logits(const nn::Scope& scope, const Tensor& x) const;

  tensor::Tensor forward(const nn::Scope& scope, int chunk, int num_chunks, const tensor::Tensor& x,
                         const train::Batch& mb, train::Metrics& metrics) const override;
  Shape activation_shape(const nn::Scope& scope, int chunk, int num_chunks,
                         const train::Batch& mb) const override;
  std::vector<std::string> metric_names() const override { return {"accuracy", "loss"}; }
  TensorTree init(Key key, const std::vector<int>& chunks, int num_chunks,
                  nn::ParamSpecs* specs = nullptr, spmd::DeviceContext* ctx = nullptr,
                  const nn::FullySharded* fsdp = nullptr) const override;
  const PPClassifierConfig& config() const { return config_; }

 private:
  Tensor run_chunk(const nn::Scope& scope, int chunk, int num_chunks, const Tensor& x_in,
                   const Tensor& inputs) const;
  std::pair<Tensor, train::Metrics> loss(const Tensor& logits, const Tensor& labels) const;
  PPClassifierConfig config_;
};

}  // namespace distjax::models
