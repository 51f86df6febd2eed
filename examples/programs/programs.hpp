// The training programs behind the examples and `distjax train`: each runs one
// config::TrainConfig. The example binaries turn their flags into a config and call the
// same function that `distjax train configs/<name>.toml` calls.
#pragma once

#include <string>
#include <vector>

#include "distjax/config/program_capabilities.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/nn/precision.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/train/checkpointer.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::examples {

/// A program of the registry: its name (the value of run.program), what it trains, the
/// defaults it starts from (the example binary's flag defaults), its entry point, the
/// parallelism it runs and its own checks of a config.
struct ProgramInfo {
  const char* name;
  const char* about;
  /// Sets the program's defaults on a default TrainConfig (run.program included).
  void (*defaults)(config::TrainConfig&);
  /// Runs a config that passed check_program; returns the exit status.
  int (*run)(const config::TrainConfig&);
  /// The mesh axes, ZeRO stages, FSDP and precisions it runs: a config asking for more is
  /// refused before it runs, and `distjax plan` suggests nothing beyond them.
  config::ProgramCapabilities capabilities;
  /// Its own checks of a resolved, validated config within its capabilities (sizes its
  /// mesh axes must divide, layouts, the pipeline schedule): ConfigError or NotImplemented.
  void (*check)(const config::TrainConfig&);
};

/// Every program, in the order `distjax train --help` lists them.
const std::vector<ProgramInfo>& programs();

/// The program called `name`; throws ConfigError naming the programs (and the nearest).
const ProgramInfo& find_program(const std::string& name);

/// TrainConfig{} with the defaults of program `name`.
config::TrainConfig program_defaults(const std::string& name);

/// Resolves config.distributed against the environment (comm::discover_launch_environment),
/// validates the whole config (ConfigError listing every problem, naming `source`), refuses
/// what its program does not run (check_program), makes run.out_dir (make_out_dir),
/// refuses what the run's Checkpointer would (train::check_restore: a fresh run over
/// old checkpoints, --resume without one) before any file is written, and runs its
/// program.
int run_program(config::TrainConfig config, const std::string& source = "");
/// What run_program does before it runs: the resolved, validated and checked config.
config::TrainConfig prepare_program(config::TrainConfig config, const std::string& source = "");
/// The checks of a resolved and validated config against its program: NotImplemented
/// listing every key that asks for more than ProgramInfo::capabilities ("[gpt]
/// parallelism.zero_stage = 1 is not implemented for this program ..."), then the
/// program's own ProgramInfo::check.
void check_program(const config::TrainConfig& config);
/// Creates run.out_dir (nothing when it is empty) and checks that a file can be made in it;
/// else ConfigError naming the key and the path:
///   [config] run.out_dir = "/proc/x": cannot create the directory: No such file or directory
void make_out_dir(const config::TrainConfig& c);

// The programs (one file each in examples/programs/).
int run_train_mnist(const config::TrainConfig& c);
int run_data_parallelism(const config::TrainConfig& c);
int run_tensor_parallelism(const config::TrainConfig& c);
int run_gpt(const config::TrainConfig& c);
int run_train_gpt(const config::TrainConfig& c);
int run_pipeline_parallelism(const config::TrainConfig& c);
/// The same, printing the schedule's timeline first and the measured one at the end.
int run_pipeline_parallelism(const config::TrainConfig& c, bool show_schedule);
// Their own checks (ProgramInfo::check), beside each program.
void check_train_mnist(const config::TrainConfig& c);
void check_data_parallelism(const config::TrainConfig& c);
void check_tensor_parallelism(const config::TrainConfig& c);
void check_gpt(const config::TrainConfig& c);
void check_pipeline_parallelism(const config::TrainConfig& c);

/// The nn::Precision policy of distributed.mixed_precision: "no" f32, "bf16" bf16
/// matmuls, "fp16" f16 matmul operands; f32 master weights in every case.
nn::Precision precision_of(const config::TrainConfig& c);
/// Sets state.loss_scale (a fresh train::DynamicLossScale) when mixed_precision = "fp16".
void enable_loss_scale(const config::TrainConfig& c, train::TrainState& state);
/// The checkpoint policy of a run: out_dir/checkpoints (none when out_dir is empty), saved
/// every run.checkpoint_every steps and at the end (nothing is saved when checkpoint_every
/// is 0 and resume is off), resumed by run.resume (train::Resume) leaving out
/// run.resume_drop, old checkpoints of a fresh run refused or, with run.overwrite, removed;
/// the config saved in the index as {"toml": ...}.
train::CheckpointConfig checkpoint_config(const config::TrainConfig& c);

/// A program's checkpoints around its data loader: the constructor restores `state` (and
/// moves the loader to the saved position) by run.resume and says so on the main
/// device; after_step saves every run.checkpoint_every steps; finish saves the last step
/// and says where. Collective: every device calls each.
class RunCheckpoints {
 public:
  RunCheckpoints(const config::TrainConfig& c, train::CheckpointLayout layout,
                 train::TrainState& state, data::DataLoader& loader, bool lead);
  void after_step(const train::TrainState& state);
  void finish(const train::TrainState& state);
  /// Whether the constructor resumed from a checkpoint (the metrics file is appended to).
  bool resumed() const { return resumed_; }

 private:
  train::Checkpointer ckpt_;
  data::DataLoader* loader_;
  bool lead_;
  bool resumed_ = false;
};

/// The AdamW of [optimizer]: linear warmup from 0 over optimizer.warmup_steps (at most
/// total_steps - 1), cosine decay to lr x final_lr_ratio at total_steps, decoupled weight
/// decay off biases and norms.
optim::AdamW make_adamw(const config::TrainConfig& c, std::int64_t total_steps);

/// With run.timeline: out_dir/timeline_device<d>.json, where device d's Trainer writes its
/// timeline (train::TrainerConfig::timeline_file); "" otherwise.
std::string timeline_file(const config::TrainConfig& c, int device);

/// The backend name printed in headers and recorded in summary.json ("threads", "mpi").
std::string backend_label(const config::TrainConfig& c);

}  // namespace distjax::examples
