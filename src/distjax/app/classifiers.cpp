// The classifiers on Fashion-MNIST as registered models: "classifier" (the MLP, data
// parallel, ZeRO-1/2 or fully sharded), "tp_classifier" (the toolkit's TP classifier, a
// models::ResidualClassifier the composition lays out over ("data", "model"): gather or
// ppermute rings) and "pp_classifier" (residual MLP blocks
// cut into stages over ("data", "pipe")). They share their data: each data replica reads its
// shard of every global batch from a shuffling loader, and evaluates on its share of the
// test set.
#include <cstdio>
#include <memory>

#include "distjax/app/detail/builtin_models.hpp"
#include "distjax/app/networks.hpp"
#include "distjax/app/run.hpp"
#include "distjax/data/fashion_mnist.hpp"
#include "distjax/models/pp_classifier.hpp"

namespace distjax::app::detail {

namespace {

models::ClassifierConfig mlp_config(const config::TrainConfig& c) {
  return {.in_features = 784,
          .hidden = c.model.hidden,
          .num_classes = 10,
          .dropout = static_cast<float>(c.model.dropout)};
}

}  // namespace

ModelSpec classifier_model() {
  return {
      .name = "classifier",
      .about = "the MLP classifier on Fashion-MNIST: data parallel, ZeRO-1/2 or FSDP over \"data\"",
      .axes = {"data"},
      .capabilities = {.shards = {config::Shard::None, config::Shard::Optimizer,
                                  config::Shard::Gradients, config::Shard::Parameters}},
      .epochs = true,
      .check =
          [](const config::TrainConfig& c, const mesh::Mesh& mesh) {
            DISTJAX_CHECK(c.parallelism.fsdp.modules.empty() ||
                              c.parallelism.fsdp.modules == std::vector<std::string>{"*"},
                          ConfigError,
                          "[classifier] the classifier has no Block, Attn or MLP modules: "
                          "parallelism.fsdp.modules must be [] or [\"*\"]");
            DISTJAX_CHECK(mesh.ndim() == 1, ConfigError,
                          "[classifier] runs on a (\"data\") mesh, got ", mesh.describe());
          },
      .build =
          [](const config::TrainConfig& c, const mesh::Mesh&) {
            const auto mlp = std::make_shared<const models::Classifier>(mlp_config(c));
            Model m = fashion_mnist_model(c, /*pipelined=*/false);
            m.network = classifier_network(*mlp);
            m.network.keep = mlp;
            m.description = "Classifier 784-" + std::to_string(c.model.hidden) + "-10";
            m.num_parameters = mlp->num_params();
            return m;
          }};
}

ModelSpec tp_classifier_model() {
  return {.name = "tp_classifier",
          .about =
              "the toolkit's TP classifier on Fashion-MNIST over (data, model): gather or "
              "async rings",
          .axes = {"data", "model"},
          .capabilities = {.tensor_parallel = true},
          .epochs = true,
          .check =
              [](const config::TrainConfig& c, const mesh::Mesh& mesh) {
                const std::string& layout = c.parallelism.tp_layout;
                DISTJAX_CHECK(
                    layout == "gather" || layout == "async", ConfigError,
                    "[tp_classifier] parallelism.tp_layout must be \"gather\" (synchronous) or "
                    "\"async\" (ppermute rings), got \"",
                    layout, "\"");
                DISTJAX_CHECK(c.model.hidden % mesh.axis_size("model") == 0, ConfigError,
                              "[tp_classifier] model.hidden = ", c.model.hidden,
                              " must be divisible by the \"model\" axis size ",
                              mesh.axis_size("model"));
              },
          .build =
              [](const config::TrainConfig& c, const mesh::Mesh&) {
                const models::ResidualClassifierConfig config{
                    .in_features = 784,
                    .hidden = c.model.hidden,
                    .num_classes = 10,
                    .num_layers = static_cast<int>(c.model.layers),
                    .mlp_expansion = 1,
                    .dropout = static_cast<float>(c.model.dropout)};
                Model m = fashion_mnist_model(c, /*pipelined=*/false);
                m.network = residual_classifier_network(config);
                m.description = "TP classifier 784-" + std::to_string(c.model.hidden) + " x" +
                                std::to_string(c.model.layers) + "-10";
                m.num_parameters = models::ResidualClassifier(config).num_params();
                return m;
              }};
}

ModelSpec pp_classifier_model() {
  return {.name = "pp_classifier",
          .about = "residual MLP blocks on Fashion-MNIST cut into stages over (data, pipe)",
          .axes = {"data", "pipe"},
          .capabilities = {.pipeline_parallel = true},
          .epochs = true,
          .check =
              [](const config::TrainConfig& c, const mesh::Mesh& mesh) {
                DISTJAX_CHECK(
                    mesh.ndim() == 2 && mesh.has_axis("data") && mesh.has_axis("pipe"), ConfigError,
                    "[pp_classifier] runs on a (\"data\", \"pipe\") mesh, got ", mesh.describe());
                parallel::make_schedule(parallel::parse_schedule_kind(c.parallelism.schedule),
                                        mesh.axis_size("pipe"),
                                        static_cast<int>(c.parallelism.microbatches),
                                        static_cast<int>(c.parallelism.virtual_stages));
              },
          .build =
              [](const config::TrainConfig& c, const mesh::Mesh&) {
                const auto pp = std::make_shared<const models::PPClassifier>(
                    models::PPClassifierConfig{.in_features = 784,
                                               .hidden = c.model.hidden,
                                               .num_layers = c.model.layers,
                                               .mlp_expansion = 2,
                                               .num_classes = 10,
                                               .dropout = static_cast<float>(c.model.dropout)});
                Model m = fashion_mnist_model(c, /*pipelined=*/true);
                // Only ever run cut into stages: no whole-model init, the pipeline is the network.
                m.network = {.pipeline = pp.get(), .keep = pp};
                m.description = "PP classifier 784-" + std::to_string(c.model.hidden) + " x" +
                                std::to_string(c.model.layers) + "-10";
                m.num_parameters = pp->init(Key::from_seed(0)).num_elements();
                return m;
              }};
}

}  // namespace distjax::app::detail
