// Checkpointer: the checkpoint policy of a training run (restore on --resume, save every N
// steps and at the end), on top of save_checkpoint / load_checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "distjax/train/checkpoint.hpp"

namespace distjax::train {

/// Options of a Checkpointer (what a training run configures).
struct CheckpointConfig {
  std::string dir;            ///< where step directories go; empty: no checkpoints
  std::int64_t every = 0;     ///< save when state.step is a multiple of this (0: only at the end)
  int keep_last = 0;          ///< see SaveOptions::keep_last
  bool resume = false;        ///< restore() loads the latest checkpoint of dir when there is one
  std::string config = "{}";  ///< the run's configuration (JSON text), saved in the index
  std::function<void(const std::string& stage)> fault_hook{};  ///< SaveOptions::fault_hook
};

/// The checkpoint policy of a run, next to its Trainer: restore at the start (--resume),
/// save every N steps and at the end. Every device calls it (it is collective).
///
///   train::Checkpointer ckpt({.dir = out + "/checkpoints", .every = 100, .resume = resume},
///                            {&ctx, &specs, &strategy});
///   if (auto pos = ckpt.restore(state)) loader.seek({pos->epoch, pos->batch});
///   while (state.step < steps) {
///     trainer.step(state, loader.next());
///     ckpt.maybe_save(state, {loader.position().epoch, loader.position().batch});
///   }
///   ckpt.save(state, ...);   // at the end (skipped when this step is saved already)
class Checkpointer {
 public:
  Checkpointer(CheckpointConfig config, CheckpointLayout layout);

  /// With config.resume and a checkpoint in config.dir: loads it into `state` and returns
  /// the data position to continue from; nullopt otherwise (a fresh run).
  std::optional<DataPosition> restore(TrainState& state);
  /// Saves when config.every > 0 and state.step is a multiple of it; returns whether it did.
  bool maybe_save(const TrainState& state, DataPosition data);
  /// Saves now unless this step was just saved or restored; returns the step directory
  /// (empty when no dir is configured or nothing was written).
  std::string save(const TrainState& state, DataPosition data);

  const CheckpointConfig& config() const { return config_; }

 private:
  CheckpointConfig config_;
  CheckpointLayout layout_;
  std::int64_t last_saved_step_ = -1;
};

}  // namespace distjax::train
