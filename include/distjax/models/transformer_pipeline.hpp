// TransformerPipeline: the GPT Transformer cut into pipeline chunks (embedding on the
// first, blocks spread over the chunks, final norm, head and loss on the last), with its
// tensor-parallel layout inside each stage.
// Shape legend: B batch, b micro-batch, T sequence, C = d_model, V vocabulary, n model axis.
#pragma once

#include <vector>

#include "distjax/models/transformer.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/train/loss.hpp"

namespace distjax::models {

/// The pipeline module of a Transformer. Tokens (B, T) and next-token targets (B, T) come
/// in a train::Batch (inputs, labels), with a packed batch's document ids (documents) for
/// every chunk's attention and the last chunk's loss (Transformer::loss). Parameters keep the whole model's paths
/// ("wte/embedding" on chunk 0, "blocks/<i>/..." on the chunk holding block i, "ln_f" and
/// "lm_head" on the last), so a stage's values are exactly the whole model's. Needs
/// untied embeddings when the first and last chunk differ (the head cannot read "wte" on
/// another stage): ConfigError otherwise. The activation between chunks is the residual
/// stream, Transformer::residual_shape (varying over the model axis when the layout splits
/// it).
///
///   models::TransformerPipeline gpt({.num_layers = 8, .tied_embeddings = false});
///   parallel::Pipeline pp(ctx, gpt, {.schedule = ScheduleKind::OneFOneB, .microbatches = 8});
///   TensorTree params = gpt.init(key, pp.chunks(), pp.num_chunks(), &specs, &ctx);
class TransformerPipeline final : public parallel::PipelineModule {
 public:
  /// `layers_per_chunk`: blocks per chunk (empty: balanced, parallel::partition_layers).
  explicit TransformerPipeline(TransformerConfig config, std::vector<int> layers_per_chunk = {});

  const Transformer& model() const { return model_; }
  /// The loss function of the whole model on one device (the reference of a pipeline),
  /// with the same metrics as the last chunk.
  train::LossFn loss_fn() const;

  tensor::Tensor forward(const nn::Scope& scope, int chunk, int num_chunks, const tensor::Tensor& x,
                         const train::Batch& mb, train::Metrics& metrics) const override;
  Shape activation_shape(const nn::Scope& scope, int chunk, int num_chunks,
                         const train::Batch& mb) const override;
  mesh::Axes activation_axes() const override;
  /// "loss" and "bits_per_byte" (the loss in bits: nats / ln 2), and with MoE layers their
  /// statistics (models::moe_metric_names: every chunk reports those of its layers).
  std::vector<std::string> metric_names() const override;
  TensorTree init(Key key, const std::vector<int>& chunks, int num_chunks,
                  nn::ParamSpecs* specs = nullptr, spmd::DeviceContext* ctx = nullptr,
                  const nn::FullySharded* fsdp = nullptr) const override;

 private:
  tensor::Tensor run_chunk(const nn::Scope& scope, int chunk, int num_chunks, const tensor::Tensor& x,
                           const tensor::Tensor& tokens,
                           const tensor::Tensor& documents = tensor::Tensor()) const;
  Transformer model_;
  std::vector<int> layers_per_chunk_;
};

}  // namespace distjax::models
