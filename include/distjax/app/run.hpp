// The training loop, written once: restore, step, log, evaluate, checkpoint, finish
// (summary, timeline). app::train (app/train.hpp) builds a registered model's data, its
// network and the composed strategies (app/compose.hpp) and hands them to run_loop on every
// device; a hand-written shard_map program can call it the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distjax/app/compose.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/train/checkpointer.hpp"
#include "distjax/train/trainer.hpp"

namespace distjax::app {

/// The results of a run on this device.
struct LoopResult {
  train::Metrics eval{};          ///< the last evaluation
  train::Metrics initial_eval{};  ///< with eval_at_start
  bool resumed = false;
  /// Resumed from a checkpoint at or past total_steps: nothing trained, no file written
  /// (eval is the evaluation of the restored parameters, not logged).
  bool already_finished = false;
  std::string checkpoint{};     ///< the last checkpoint saved ("" when none)
};

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
  /// Recorded in summary.json; empty: the device context's mesh (Mesh::describe:
  /// ("data"=2, "model"=2, "pipe"=2)), or "single device" without one.
  std::string mesh{};
  /// Recorded in summary.json; empty: backend_label(*config) on a mesh, "none" without one.
  std::string backend{};
  /// The whole model's parameters, summary.json's num_parameters (0: this device's, which
  /// summary.json also has as num_parameters_on_device).
  std::int64_t model_parameters = 0;
  bool print = true;                    ///< the Trainer's lines, on the main device
  /// This device's batch of the step about to run (state.step steps done).
  std::function<train::Batch(std::int64_t step)> batch{};
  /// When the batches come from a loader: its position is saved with each checkpoint and
  /// restored on resume. Null: the data of step s is drawn from s alone (the position
  /// saved is the step).
  data::DataLoader* loader = nullptr;
  /// This device's share of the evaluation set (Composed::evaluate): evaluated every
  /// `eval_every` steps (0: never during training), once more at the end, and first when
  /// `eval_at_start`. None: no evaluation.
  std::vector<train::Batch> eval_batches{};
  std::int64_t eval_every = 0;
  bool eval_at_start = false;
  /// After each step, with its metrics (a program's own progress lines).
  std::function<void(std::int64_t step, const train::Metrics& metrics)> on_step{};
  /// On every device after the last step and checkpoint, before the last evaluation (a
  /// collective is allowed): values for summary.json.
  std::function<std::map<std::string, double>()> after_training{};
  /// With the evaluations done: more values for summary.json.
  std::function<std::map<std::string, double>(const LoopResult& result)> summary{};
};

/// Runs `loop` on this device until state.step reaches total_steps: restores by
/// run.resume (saying so on the main device; a checkpoint at or past total_steps trains
/// nothing and changes no file: LoopResult::already_finished), runs Trainer steps through the composed
/// strategy, saves every run.checkpoint_every steps, evaluates, saves the last step,
/// writes summary.json and the timeline (Trainer::finish) and prints where the checkpoint
/// is. Under a pipeline the devices of the pipe axis meet before the last step, so its
/// measured timeline starts together. Collective: every device calls it.
LoopResult run_loop(const Loop& loop);

/// The AdamW of [optimizer]: linear warmup from 0 over optimizer.warmup_steps (at most
/// total_steps - 1), cosine decay to lr x final_lr_ratio at total_steps, decoupled weight
/// decay off biases and norms.
optim::AdamW make_adamw(const config::TrainConfig& c, std::int64_t total_steps);

/// The checkpoint policy of a run: out_dir/checkpoints (none when out_dir is empty), saved
/// every run.checkpoint_every steps and at the end (nothing is saved when checkpoint_every
/// is 0 and resume is off), resumed by run.resume (train::Resume) leaving out
/// run.resume_drop, old checkpoints of a fresh run refused or, with run.overwrite, removed;
/// the config saved in the index as {"toml": ...}.
train::CheckpointConfig checkpoint_config(const config::TrainConfig& c);

/// With run.timeline: out_dir/timeline_device<d>.json, where device d's Trainer writes its
/// timeline (train::TrainerConfig::timeline_file); "" otherwise.
std::string timeline_file(const config::TrainConfig& c, int device);

/// The backend name printed in headers and recorded in summary.json ("threads", "mpi").
std::string backend_label(const config::TrainConfig& c);

/// The rows [replica x B/n, (replica + 1) x B/n) of `batch`: this data replica's slice.
train::Batch replica_slice(const train::Batch& batch, int replica, int replicas);

}  // namespace distjax::app
