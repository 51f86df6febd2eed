// Checkpointer: the checkpoint policy of a training run (restore on --resume, refuse to
// start afresh over old checkpoints, save every N steps and at the end), on top of
// save_checkpoint / load_checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distjax/train/checkpoint.hpp"

namespace distjax::train {

/// Whether a run continues from the checkpoints of its directory (run.resume, --resume).
enum class Resume : std::uint8_t {
  Off,       ///< a fresh run: a directory holding checkpoints is an error (unless overwrite)
  Required,  ///< continue from the latest checkpoint: none is an error saying where it looked
  Auto,      ///< continue from the latest checkpoint when there is one, else start fresh
};

/// Options of a Checkpointer (what a training run configures).
struct CheckpointConfig {
  std::string dir;              ///< where step directories go; empty: no checkpoints
  std::int64_t every = 0;       ///< save when state.step is a multiple of this (0: only at the end)
  int keep_last = 0;            ///< see SaveOptions::keep_last
  Resume resume = Resume::Off;  ///< what restore() does with the checkpoints of dir
  /// With Resume::Off: restore() removes the checkpoints of dir (remove_checkpoints)
  /// instead of refusing to start, so that `latest` never names the old run's.
  bool overwrite = false;
  std::vector<std::string> drop{};  ///< LoadOptions::drop of restore()
  /// false: the run writes no checkpoints (save and maybe_save do nothing), while
  /// restore() still resumes from dir or guards it as above.
  bool saves = true;
  std::string config = "{}";  ///< the run's configuration (JSON text), saved in the index
  std::function<void(const std::string& stage)> fault_hook{};  ///< SaveOptions::fault_hook
};

/// The refusals of Checkpointer::restore, checked by this process alone (no collective, no
/// file changed): ConfigError for a fresh run over checkpoints without overwrite, or a
/// required resume without a checkpoint. Lets a program refuse before it writes a file.
void check_restore(const CheckpointConfig& config);

/// The checkpoint policy of a run, next to its Trainer: restore at the start (--resume),
/// save every N steps and at the end. Every device calls it (it is collective).
///
///   train::Checkpointer ckpt({.dir = out + "/checkpoints", .every = 100,
///                             .resume = train::Resume::Auto},
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

  /// At the start of a run, by config.resume (nothing without a dir):
  ///  - Off: returns nullopt; when dir holds a checkpoint, throws ConfigError ("... holds
  ///    checkpoints up to step N: pass --resume ...") or, with config.overwrite, removes
  ///    them;
  ///  - Required: loads the latest checkpoint of dir into `state` (load_checkpoint with
  ///    config.drop) and returns the data position to continue from; ConfigError saying
  ///    where it looked when there is none;
  ///  - Auto: as Required when dir holds a checkpoint, else nullopt (a fresh run).
  std::optional<DataPosition> restore(TrainState& state);
  /// Whether maybe_save saves at this step: config.every > 0 and state.step a multiple of
  /// it (check what the steps produced first: Trainer::check_finite).
  bool due(const TrainState& state) const {
    return config_.every > 0 && state.step % config_.every == 0;
  }
  /// Saves when config.saves and due(state); returns whether it did.
  bool maybe_save(const TrainState& state, DataPosition data);
  /// Saves now unless this step was just saved or restored; returns the step directory
  /// (empty when no dir is configured, config.saves is false or nothing was written).
  std::string save(const TrainState& state, DataPosition data);

  const CheckpointConfig& config() const { return config_; }
  /// The configuration (JSON text) the checkpoint restore() loaded was saved with: "{}"
  /// before a restore, or when it recorded none.
  const std::string& restored_config() const { return restored_config_; }

 private:
  /// The checkpoint of dir that every device finds (find_checkpoint); collective.
  std::optional<std::string> find_agreed() const;

  CheckpointConfig config_;
  CheckpointLayout layout_;
  std::int64_t last_saved_step_ = -1;
  std::string restored_config_ = "{}";
};

}  // namespace distjax::train
