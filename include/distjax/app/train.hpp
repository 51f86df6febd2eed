// Training a config: app::train runs any config::TrainConfig on the model its run.program
// names (app/model.hpp): it builds the mesh, runs the devices (threads, or one per process
// under a launcher), composes the parallelisms (app/compose.hpp) and runs the loop
// (app/run.hpp). `distjax train configs/<name>.toml`, the example binaries and programs of
// one's own call it. The configs under configs/ are built into the library (the binaries
// need no file at run time); keys a file leaves out take their defaults, the member
// initialisers of config/train_config.hpp: the only defaults there are.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distjax/app/model.hpp"
#include "distjax/config/train_config.hpp"

namespace distjax::app {

/// The names of the configs built into the library: the files of configs/ ("train_mnist",
/// "fsdp", "gpt_3d", ...).
std::vector<std::string> builtin_configs();
/// The config of configs/<name>.toml as built into the library (each example binary
/// starts from the one with its name); ConfigError naming the configs for another name.
config::TrainConfig builtin_config(const std::string& name);

/// What train shows beyond its usual lines.
struct TrainOptions {
  /// A pipeline's schedule before the run and, with simulated devices, the measured
  /// timeline of its last step after it.
  bool show_schedule = false;
  /// The sharding of every parameter (parallel::sharding_table) before the first step.
  bool show_sharding = false;
  /// The run may be stopped early by request_stop(): after each step the devices agree
  /// (one all-reduce of a flag over every device) whether a stop was asked for. What the
  /// Python front's train() sets, with a Ctrl-C handler calling request_stop().
  bool stoppable = false;
};

/// The exit status of a stoppable run that app::request_stop() (app/run.hpp) ended early
/// (128 + SIGINT).
inline constexpr int kStoppedStatus = 130;

/// Trains `config` (prepare_program first, naming `source` in its errors): builds the
/// model run.program names and its mesh, prints the mesh, the parallelisms and the
/// model's lines, runs the loop (restore, step, log, evaluate, checkpoint, finish) on every
/// device of this process over the composed parallelisms, and prints the model's report, the bytes device 0 holds and, with a
/// pipeline, its measured bubble; run.timeline writes the timeline. Returns the exit status.
int train(config::TrainConfig config, const std::string& source = "",
          const TrainOptions& options = {});
/// train for a config prepare_program already returned.
int train_prepared(const config::TrainConfig& config, const TrainOptions& options = {});

/// Resolves config.distributed against the environment (comm::discover_launch_environment),
/// validates the whole config (ConfigError listing every problem, naming `source`), refuses
/// what its model does not run (check_program), makes and holds run.out_dir (make_out_dir,
/// hold_out_dir) and refuses what the run's Checkpointer would (train::check_restore: a
/// fresh run over old checkpoints, --resume without one) before any file is written.
config::TrainConfig prepare_program(config::TrainConfig config, const std::string& source = "");
/// The checks of a resolved and validated config against its model: NotImplemented
/// listing every key that asks for more than ModelSpec::capabilities ("[gpt]
/// parallelism.shard = "optimizer" is not implemented for this program ..."), then the
/// model's own ModelSpec::check.
void check_program(const config::TrainConfig& config);
/// Creates run.out_dir (nothing when it is empty) and checks that a file can be made in it;
/// else ConfigError naming the key and the path:
///   [config] run.out_dir = "/proc/x": cannot create the directory: No such file or directory
void make_out_dir(const config::TrainConfig& c);
/// Holds run.out_dir for this process until it ends (an exclusive lock on
/// <out_dir>/.distjax.lock, which names the holder), so that a second run started into the
/// same directory is refused before it writes anything instead of mixing its metrics with
/// the first's; ConfigError:
///   [config] run.out_dir = "runs/x" is in use by another run (pid 4242 on host since ...):
///   wait for it to finish, or choose another --out
/// A later run of the same process reuses its lock. prepare_program calls it in the process
/// that writes the run's files (rank 0 under a launcher).
void hold_out_dir(const config::TrainConfig& c);

/// main()'s body for a binary: runs `fn`; an exception prints "<program>: <message>" on
/// stderr and returns 1.
int run_main(const char* program, const std::function<int()>& fn);

/// For a command line its parser refused, "did you mean" lines ("" when none): a first word
/// that is no subcommand, nearest one (`distjax trian` -> `did you mean "train"?`), a flag
/// that is none of `flags`, nearest one (`--ouput` -> `did you mean --out?`), and
/// `--set KEY VALUE` for `--set KEY=VALUE`. `args` are argv[1..]; `flags` the long names
/// with their dashes.
std::string command_line_hint(const std::vector<std::string>& args,
                              const std::vector<std::string>& subcommands,
                              const std::vector<std::string>& flags);

}  // namespace distjax::app
