// The training programs of DistJax: each runs one config::TrainConfig. `distjax train
// configs/<name>.toml` and the example binaries call the same function; a program's
// starting config is its file under configs/ (built into the library, so the binaries
// need no file at run time), and keys a file leaves out take their defaults, the member
// initialisers of config/train_config.hpp: the only defaults there are.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distjax/config/program_capabilities.hpp"
#include "distjax/config/train_config.hpp"

namespace distjax::app {

/// A program of the registry: its name (the value of run.program), what it trains, its
/// entry point, the parallelism it runs and its own checks of a config.
struct ProgramInfo {
  const char* name;
  const char* about;
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

/// The names of the configs built into the library: the files of configs/ ("train_mnist",
/// "fsdp", "gpt_3d", ...).
std::vector<std::string> builtin_configs();
/// The config of configs/<name>.toml as built into the library (each example binary
/// starts from the one with its name); ConfigError naming the configs for another name.
config::TrainConfig builtin_config(const std::string& name);

/// Resolves config.distributed against the environment (comm::discover_launch_environment),
/// validates the whole config (ConfigError listing every problem, naming `source`), refuses
/// what its program does not run (check_program), makes and holds run.out_dir (make_out_dir,
/// hold_out_dir),
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

// The programs (one file each in src/distjax/app/).
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

}  // namespace distjax::app
