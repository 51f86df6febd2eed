#include "distjax/models/transformer_pipeline.hpp"

#include <numbers>

#include "distjax/models/classifier.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::models {

using tensor::Tensor;

TransformerPipeline::TransformerPipeline(TransformerConfig config,
                                         std::vector<int> layers_per_chunk)
    : model_(std::move(config)), layers_per_chunk_(std::move(layers_per_chunk)) {}

namespace {
// "bits_per_byte" of a mean loss per token over `count` positions (TransformerConfig's
// tokens_per_byte > 0: token text).
void add_bits_per_byte(train::Metrics& metrics, const Tensor& loss, double count,
                       const TransformerConfig& c) {
  if (c.tokens_per_byte > 0)
    metrics.add("bits_per_byte", loss, count * c.tokens_per_byte / std::numbers::ln2, count);
}
}  // namespace

train::LossFn TransformerPipeline::loss_fn() const {
  return [this](const TensorTree& params, const train::Batch& batch, Key key) {
    const nn::Scope scope = nn::Scope::apply(&params, /*train=*/true, key);
    if (model_.config().num_classes > 0)
      return classification_loss(model_(scope, batch.inputs), batch.labels);
    Tensor loss = model_.loss(scope, batch.inputs, batch.labels, batch.documents);
    const auto b = static_cast<double>(batch.size());
    train::Metrics metrics;  // read when reported: no host wait here
    metrics.add("loss", loss, b, b);
    metrics.add("bits_per_" + model_.config().unit, loss, b / std::numbers::ln2, b);
    add_bits_per_byte(metrics, loss, b, model_.config());
    return std::make_pair(loss, metrics);
  };
}

Tensor TransformerPipeline::run_chunk(const nn::Scope& scope, int chunk, int num_chunks,
                                      const Tensor& x_in, const Tensor& tokens,
                                      const Tensor& documents) const {
  const TransformerConfig& c = model_.config();
  DISTJAX_CHECK(!c.tied_embeddings || num_chunks == 1, ConfigError,
                "[TransformerPipeline] tied embeddings need \"wte\" on the first and the last "
                "chunk; set tied_embeddings = false to pipeline the model over ",
                num_chunks, " chunks");
  const auto [first, last] = parallel::partition_layers(static_cast<int>(c.num_layers), num_chunks,
                                                        layers_per_chunk_)[chunk];
  Tensor x = chunk == 0 ? model_.embed(scope, tokens) : x_in;
  for (int i = first; i < last; ++i)
    x = model_.block(scope, i, x, documents);
  return chunk == num_chunks - 1 ? model_.head(scope, x) : x;
}

Tensor TransformerPipeline::forward(const nn::Scope& scope, int chunk, int num_chunks,
                                    const Tensor& x, const train::Batch& mb,
                                    train::Metrics& metrics) const {
  // The chunk's MoE layers report their statistics from whichever stage holds them.
  nn::Sown sown;
  Tensor y = run_chunk(model_.config().moe_layers() > 0 ? scope.sowing(&sown) : scope, chunk,
                       num_chunks, x, mb.inputs, mb.documents);
  add_moe_metrics(sown, metrics);
  if (chunk < num_chunks - 1) return y;
  if (model_.config().num_classes > 0) {
    auto [loss, m] = classification_loss(y, mb.labels);
    metrics.merge(m);
    return loss;
  }
  Tensor loss = model_.loss_of_logits(scope, y, mb.labels, mb.documents);
  // Per sequence, as the "loss" entry the pipeline adds: the mean is per position alike.
  const double b = static_cast<double>(mb.size());
  metrics.add("bits_per_" + model_.config().unit, loss, b / std::numbers::ln2, b);
  add_bits_per_byte(metrics, loss, b, model_.config());
  return loss;
}

std::vector<std::string> TransformerPipeline::metric_names() const {
  if (model_.config().num_classes > 0) return {"accuracy", "loss"};
  std::vector<std::string> out = {"loss", "bits_per_" + model_.config().unit};
  if (model_.config().tokens_per_byte > 0) out.push_back("bits_per_byte");
  for (std::string& name : moe_metric_names(model_.config())) out.push_back(std::move(name));
  return out;
}

Shape TransformerPipeline::activation_shape(const nn::Scope& scope, int, int,
                                            const train::Batch& mb) const {
  return model_.residual_shape(scope, mb.size(), mb.inputs.size(1));
}

mesh::Axes TransformerPipeline::activation_axes() const {
  const TransformerTP& tp = model_.config().tp;
  const bool split = tp.layout == parallel::TPLayout::Gather ||
                     tp.layout == parallel::TPLayout::Async ||
                     (tp.layout == parallel::TPLayout::Megatron && tp.sequence_parallel);
  return split ? mesh::Axes(tp.axis) : mesh::Axes();
}

TensorTree TransformerPipeline::init(Key key, const std::vector<int>& chunks, int num_chunks,
                                     nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                                     const nn::FullySharded* fsdp) const {
  const Tensor tokens = model_.example_input(1, model_.init_seq_len(ctx));
  return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& scope) {
    for (int chunk : chunks) {
      Tensor x;
      if (chunk > 0) {
        x = Tensor::zeros(model_.residual_shape(scope, 1, tokens.size(1)));
        if (ctx != nullptr) x.set_varying_axes(ctx->axis_mask(activation_axes()));
      }
      run_chunk(scope, chunk, num_chunks, x, tokens);
    }
  });
}

}  // namespace distjax::models
