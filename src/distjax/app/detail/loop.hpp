// The training loop of app::train, written once: restore, step, log, evaluate,
// checkpoint, finish (summary, timeline), over train::Trainer (the step and its records).
// app::train (src/distjax/app/train.cpp) builds a registered model's data and network and
// the composed strategies and hands them to run_loop on every device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distjax/app/compose.hpp"
#include "distjax/app/model.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/train/trainer.hpp"

namespace distjax::app::detail {

/// What one device's run is made of.
struct Loop {
  const config::TrainConfig* config = nullptr;
  spmd::DeviceContext* ctx = nullptr;  ///< null: one device, no mesh
  Composed* composed = nullptr;        ///< strategy, loss, evaluation
  const optim::Optimizer* optimizer = nullptr;
  train::TrainState* state = nullptr;
  // The Trainer's (train::TrainerConfig; the loop sets its files, the device and a resume).
  std::int64_t total_steps = 0;
  std::int64_t log_every = 50;          ///< a progress line every this many steps
  double items_per_example = 1;         ///< e.g. T tokens per sequence for a language model
  std::string items_name = "examples";  ///< unit of throughput: "examples" or "tokens"
  /// The whole model's parameters, summary.json's num_parameters (0: this device's, which
  /// summary.json also has as num_parameters_on_device).
  std::int64_t model_parameters = 0;
  /// This device's batch of the step about to run (state.step steps done).
  std::function<train::Batch(std::int64_t step)> batch{};
  /// When the batches come from a loader: its position is saved with each checkpoint and
  /// restored on resume. Null: the data of step s is drawn from s alone (the position
  /// saved is the step).
  data::DataLoader* loader = nullptr;
  /// Make the next step's batch on a host thread while a step trains (data::Prefetcher);
  /// only where the data of step s follows from s (no loader).
  bool prefetch = true;
  /// This device's share of the evaluation set (Composed::evaluate): evaluated every
  /// `eval_every` steps (0: never during training), once more at the end, and first when
  /// `eval_at_start`. None: no evaluation.
  std::vector<train::Batch> eval_batches{};
  std::int64_t eval_every = 0;
  bool eval_at_start = false;
  /// After each step the devices agree whether app::request_stop() was called (one
  /// all-reduce of a flag); if so the run ends there as after its last step (checkpoint,
  /// evaluation, summary), and RunResult::stopped says so.
  bool stoppable = false;
  /// On every device after the last step and checkpoint, before the last evaluation (a
  /// collective is allowed): values for summary.json.
  std::function<std::map<std::string, double>()> after_training{};
  /// With the evaluations done: more values for summary.json.
  std::function<std::map<std::string, double>(const RunResult& result)> summary{};
};

/// Runs `loop` on this device until state.step reaches total_steps: restores by
/// run.resume (saying so on the main device; a checkpoint at or past total_steps trains
/// nothing and changes no file: RunResult::already_finished), runs Trainer steps through the composed
/// strategy, saves every run.checkpoint_every steps, evaluates, saves the last step,
/// writes summary.json and the timeline (Trainer::finish) and prints where the checkpoint
/// is. Under a pipeline the devices of the pipe axis meet before the last step, so its
/// measured timeline starts together. Collective: every device calls it.
RunResult run_loop(const Loop& loop);

}  // namespace distjax::app::detail
