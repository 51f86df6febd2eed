// Models as registrations: a model says what it is (its name, the config keys it reads, the
// mesh axes and parallelisms it runs) and how it builds for a run (its network, its data, its
// evaluation and its closing lines); app::train (app/train.hpp) does the rest for every
// model alike: the mesh, the devices, the composed parallelisms (app/compose.hpp), the loop.
// The library registers the classifiers and the GPT; a program registers its own with
// register_model and trains it through the same train(config):
//
//   app::register_model({.name = "vit", .about = "a ViT on Fashion-MNIST",
//                        .axes = {"data", "model"}, .capabilities = {...},
//                        .build = [](const config::TrainConfig& c, const mesh::Mesh& mesh) {
//                          app::Model m; ...; return m; }});
//   c.run.program = "vit";
//   return app::train(c);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distjax/app/compose.hpp"
#include "distjax/config/program_capabilities.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/train/metrics.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::app {

/// The results of a run on one device (what a model's summary and report read).
struct RunResult {
  train::Metrics eval{};          ///< the last evaluation
  train::Metrics initial_eval{};  ///< with run.eval_at_start
  bool resumed = false;
  /// Resumed from a checkpoint at or past the run's last step: nothing trained, no file
  /// written (eval is the evaluation of the restored parameters, not logged).
  bool already_finished = false;
  std::string checkpoint{};  ///< the last checkpoint saved ("" when none)
  /// Ended early by app::request_stop() (TrainOptions::stoppable).
  bool stopped = false;
};

/// Where a device stands in the run: what its data and its closing lines depend on.
struct DevicePlace {
  spmd::DeviceContext* ctx = nullptr;  ///< null: one device, no mesh
  int replica = 0;                     ///< its index along "data"
  int replicas = 1;                    ///< devices that see different examples
  bool lead = true;                    ///< the main device (prints, writes the files)
};

/// One device's data for a run.
struct DeviceData {
  /// This device's batch of the step about to run (`step` steps done).
  std::function<train::Batch(std::int64_t step)> batch{};
  /// When the batches come from a loader: its position is saved with each checkpoint and
  /// restored on resume. Null: the data of step s is drawn from s alone.
  std::shared_ptr<data::DataLoader> loader{};
  /// This device's share of the evaluation set: every device of a data replica the same
  /// batches (as many on every replica: a fully sharded forward is a collective).
  std::vector<train::Batch> eval{};
};

/// A model built for one run (ModelSpec::build): shared by the devices of the process,
/// read-only while they run. The functions keep what they use alive (capture shared_ptrs).
struct Model {
  /// What the composition applies the parallelisms to.
  Network network{};
  /// "GPT L=2 C=64 H=4 T=64", printed with its parameter counts; empty: the model's name.
  std::string description{};
  /// The whole model's parameters (summary.json's num_parameters); 0: counted from a
  /// whole-model init on the host.
  std::int64_t num_parameters = 0;
  /// Steps of the run; 0: run.steps.
  std::int64_t total_steps = 0;
  /// Steps between evaluations; 0: run.eval_every.
  std::int64_t eval_every = 0;
  /// Throughput unit: e.g. T "tokens" per sequence for a language model.
  double items_per_example = 1;
  std::string items_name = "examples";
  /// Lines the main process prints before the devices run (its data, its evaluation set).
  std::vector<std::string> header{};
  /// This device's data.
  std::function<DeviceData(const DevicePlace& place)> data{};
  /// Values for summary.json from the run's result (the last evaluation: RunResult::eval).
  std::function<std::map<std::string, double>(const RunResult& result)> summary{};
  /// What the main device prints after the run, before the common lines (bytes held, the
  /// pipeline's bubble): e.g. "Test accuracy: 87.31% (10,000 images)". On one device without
  /// a mesh `state` holds the whole model (a language model samples from it).
  std::function<std::string(const RunResult& result, const train::TrainState& state,
                            const DevicePlace& place)>
      report{};
};

/// A model of the registry.
struct ModelSpec {
  /// The value of run.program that names it ("classifier", "gpt").
  std::string name{};
  /// One line for `distjax train --help`.
  std::string about{};
  /// Its mesh axes but "pipe" (config::build_mesh adds "pipe" for a pipeline): {"data"},
  /// {"data", "model"}.
  std::vector<std::string> axes = {"data"};
  /// What it runs of the parallelisms: a config asking for more is refused before it runs,
  /// and `distjax plan` suggests nothing beyond it.
  config::ProgramCapabilities capabilities{};
  /// It trains run.epochs passes over its data when run.steps is 0 (else it needs run.steps).
  bool epochs = false;
  /// Its own checks of a resolved, validated config within its capabilities (sizes its mesh
  /// axes must divide, layouts): ConfigError or NotImplemented. May be empty.
  std::function<void(const config::TrainConfig& c, const mesh::Mesh& mesh)> check{};
  /// Builds the model, its data and its evaluation for a run of `c` on `mesh` (one device
  /// without distributed.enabled). Runs once per process, before the devices.
  std::function<Model(const config::TrainConfig& c, const mesh::Mesh& mesh)> build{};
};

/// Adds `spec` to the registry (a ConfigError when its name is taken or it has no build).
void register_model(ModelSpec spec);
/// Every model, the library's first, in the order `distjax train --help` lists them.
std::vector<ModelSpec> models();
/// The model called `name`; a ConfigError naming the models (and the nearest).
ModelSpec find_model(const std::string& name);

/// The mesh of `c` for `model` (its axes, "pipe" with a pipeline); a one-device mesh without
/// distributed.enabled.
mesh::Mesh model_mesh(const config::TrainConfig& c, const ModelSpec& model);

}  // namespace distjax::app
