#include "distjax/app/model_specs.hpp"

#include <numbers>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::app {

std::pair<tensor::Tensor, train::Metrics> classification_loss(const tensor::Tensor& logits,
                                                              const tensor::Tensor& labels) {
  const auto pred = tensor::argmax(logits.detach(), -1).to_vector<std::int64_t>();
  const std::int32_t* y = labels.data<std::int32_t>();
  double correct = 0;
  for (std::size_t i = 0; i < pred.size(); ++i)
    correct += pred[i] == y[i];
  train::Metrics m;
  m.add("accuracy", correct, static_cast<double>(pred.size()));
  return {tensor::mean(tensor::cross_entropy(logits, labels)), m};
}

std::pair<tensor::Tensor, train::Metrics> per_byte(tensor::Tensor mean_loss, std::int64_t bytes) {
  const double n = static_cast<double>(bytes), nats = mean_loss.item<double>();
  train::Metrics m;
  m.add("loss", nats * n, n);
  m.add("bits_per_byte", nats / std::numbers::ln2 * n, n);
  return {std::move(mean_loss), m};
}

FashionMnist load_fashion_mnist(const config::TrainConfig& c) {
  const std::string dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  return {data::load_fashion_mnist(data::Split::Train, dir),
          data::load_fashion_mnist(data::Split::Test, dir)};
}

ModelSpec classifier_spec(const models::Classifier& model) {
  return {.init = [&model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                           const nn::FullySharded* fsdp) { return model.init(key, specs, ctx, fsdp); },
          .loss = [&model](const nn::Scope& scope, const train::Batch& batch) {
            return classification_loss(model(scope, batch.inputs), batch.labels);
          }};
}

ModelSpec transformer_spec(const models::Transformer& model,
                           const models::TransformerPipeline* pipeline) {
  return {.init = [&model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                           const nn::FullySharded* fsdp) { return model.init(key, specs, ctx, fsdp); },
          .loss = [&model](const nn::Scope& scope, const train::Batch& batch) {
            return per_byte(model.loss(scope, batch.inputs, batch.labels), batch.labels.numel());
          },
          .pipeline = pipeline};
}

}  // namespace distjax::app
