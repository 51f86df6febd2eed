#include "distjax/app/model_specs.hpp"

#include "distjax/core/error.hpp"

#include <numbers>

#include "distjax/data/fashion_mnist.hpp"

namespace distjax::app {

std::pair<tensor::Tensor, train::Metrics> per_byte(tensor::Tensor mean_loss, std::int64_t bytes) {
  const auto n = static_cast<double>(bytes);
  train::Metrics m;  // read when reported: no host wait here
  m.add("loss", mean_loss, n, n);
  m.add("bits_per_byte", mean_loss, n / std::numbers::ln2, n);
  return {std::move(mean_loss), m};
}

FashionMnist load_fashion_mnist(const config::TrainConfig& c) {
  const std::string dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  return {data::load_fashion_mnist(data::Split::Train, dir),
          data::load_fashion_mnist(data::Split::Test, dir)};
}

Fortunes load_fortunes(const config::TrainConfig& c) {
  const std::string dir = c.data.dir.empty() ? data::kFortunesDir : c.data.dir;
  Fortunes f{data::load_fortunes(dir, c.data.validation_fraction), {}};
  f.validation = data::sequential_windows(f.corpus.validation, c.run.batch_size, c.data.seq_len,
                                          c.run.eval_batches);
  return f;
}

models::TransformerConfig transformer_config(const config::TrainConfig& c,
                                             models::TransformerTP tp) {
  // Byte corpora need 256 ids; a larger vocabulary (e.g. GPT-2's 50304, to train that
  // shape) leaves the rows above 255 unused by the data.
  DISTJAX_CHECK(c.model.vocab == 0 || c.model.vocab >= 256, ConfigError, "[config] model.vocab = ",
                c.model.vocab, ": the byte corpora need at least 256 ids (0 = 256)");
  return {.vocab = c.model.vocab > 0 ? c.model.vocab : 256,
          .d_model = c.model.d_model,
          .num_layers = c.model.layers,
          .num_heads = c.model.heads,
          .max_len = c.data.seq_len,
          .tied_embeddings = c.model.tie_embeddings,
          .dropout = static_cast<float>(c.model.dropout),
          // with FSDP: a block's gathered weights live only while it runs
          .remat = remat_of(c, "Block"),
          .remat_attn = remat_of(c, "Attn"),
          .remat_mlp = remat_of(c, "MLP"),
          .tp = std::move(tp)};
}

ModelSpec classifier_spec(const models::Classifier& model) {
  return {.init = [&model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                           const nn::FullySharded* fsdp) { return model.init(key, specs, ctx, fsdp); },
          .loss = [&model](const nn::Scope& scope, const train::Batch& batch) {
            return models::classification_loss(model(scope, batch.inputs), batch.labels);
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
