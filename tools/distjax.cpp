// distjax: the command line of DistJax. Each subcommand is one function add_<name>(app,
// command) that registers its options and, when chosen, sets `command` to what it runs.
//
//   distjax train configs/train_mnist.toml [--set run.steps=100]... [--out DIR] [--resume]
//   mpirun -np 8 distjax train configs/data_parallelism.toml      (one process per device)
//   distjax ckpt inspect runs/gpt_3d/checkpoints
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/train/checkpoint.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

using namespace distjax;

namespace {

/// What a chosen subcommand runs; returns the exit status.
using Command = std::function<int()>;

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string out_dir;
  bool resume = false;
  bool print_config = false;
};

int train(const TrainOptions& o) {
  config::TrainConfig c = config::load_config(o.config_path, o.overrides);
  if (!o.out_dir.empty()) c.run.out_dir = o.out_dir;
  if (o.resume) c.run.resume = true;
  if (o.print_config) {
    std::fputs(config::to_toml(c).c_str(), stdout);
    return 0;
  }
  // The config as run, next to the metrics (written by the main process only).
  if (comm::discover_launch_environment().rank == 0) {
    std::filesystem::create_directories(c.run.out_dir);
    std::ofstream(std::filesystem::path(c.run.out_dir) / "config.toml")
        << "# distjax train " << o.config_path << " (with its --set / --out / --resume)\n"
        << config::to_toml(c);
  }
  return examples::run_program(c, o.config_path);
}

void add_train(CLI::App& app, Command& command) {
  auto o = std::make_shared<TrainOptions>();
  std::string programs;
  for (const examples::ProgramInfo& p : examples::programs())
    programs += std::string("\n  ") + p.name + ": " + p.about;
  CLI::App* cmd = app.add_subcommand("train", "Runs the training a TOML config describes");
  cmd->footer("Programs (run.program):" + programs +
              "\nUnder mpirun or srun it runs one device per process. See docs/configs.md.");
  cmd->add_option("config", o->config_path, "the TOML config file (see docs/configs.md)")
      ->required();
  cmd->add_option("--set", o->overrides,
                  "override one key, typed by the schema: --set run.steps=100 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--out", o->out_dir, "output directory (overrides run.out_dir)");
  cmd->add_flag("--resume", o->resume, "continue from the latest checkpoint (sets run.resume)");
  cmd->add_flag("--print-config", o->print_config,
                "print the config with every key (after --set) as TOML and exit");
  cmd->callback([o, &command] { command = [o] { return train(*o); }; });
}

void add_ckpt(CLI::App& app, Command& command) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Checkpoint tools (see docs/checkpoints.md)");
  ckpt->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect", "Prints a checkpoint's index: step, mesh, and every tensor's shape, dtype, "
                 "spec and files");
  inspect->add_option("dir", *dir,
                      "a step directory, or a run's checkpoint directory (its latest step)")
      ->required();
  inspect->callback([dir, &command] {
    command = [dir] {
      train::inspect_checkpoint(*dir, std::cout);
      return 0;
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distjax: distributed training with DistJax"};
  app.require_subcommand(1);
  Command command;
  add_train(app, command);
  add_ckpt(app, command);
  CLI11_PARSE(app, argc, argv);
  return examples::run_main("distjax", command);
}
