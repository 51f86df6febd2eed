// The policies of a run that app::train's loop reads from the config: the optimizer and its
// schedule, the checkpoints, the timeline file, the backend's name, a replica's slice of a
// batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/app/compose.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/train/checkpointer.hpp"

namespace distjax::app {

/// Asks a stoppable run of this process (app/train.hpp, TrainOptions::stoppable) to end:
/// after the step every device is in, the devices save the checkpoint (when the run saves
/// any), evaluate, write summary.json with the steps done, and train returns
/// kStoppedStatus. Async-signal-safe: a signal handler may call it. The request stays
/// until clear_stop_request() (call that before arming a handler).
void request_stop();
bool stop_requested();
void clear_stop_request();

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
