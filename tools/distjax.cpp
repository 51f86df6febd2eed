// distjax: the command line of DistJax. Each subcommand is one function add_<name>(cli,
// command) that registers its options and, when chosen, sets `command` to what it runs.
//
//   distjax train configs/train_mnist.toml [--set run.steps=100]... [--out DIR]
//                 [--resume[=auto]] [--overwrite]
//   mpirun -np 8 distjax train configs/data_parallelism.toml      (one process per device)
//   distjax ckpt inspect runs/gpt_3d/checkpoints
//   distjax plan configs/plan_gpt3_175b.toml [--budget-gib 80]      (memory and communication)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "distjax/app/train.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/data/token_shards.hpp"
#include "distjax/plan/plan.hpp"
#include "distjax/train/checkpoint.hpp"
#include "parse_command_line.hpp"

using namespace distjax;

namespace {

/// What a chosen subcommand runs; returns the exit status.
using Command = std::function<int()>;

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string out_dir;
  std::string resume;  // "" (not given), "true", "false" or "auto"
  bool overwrite = false;
  bool print_config = false;
};

int train(const TrainOptions& o) {
  config::TrainConfig c = config::load_config(o.config_path, o.overrides);
  if (!o.out_dir.empty()) c.run.out_dir = o.out_dir;
  if (!o.resume.empty()) config::apply_override(c, "run.resume=" + o.resume);
  if (o.overwrite) c.run.overwrite = true;
  if (o.print_config) {
    std::fputs(config::to_toml(c).c_str(), stdout);
    return 0;
  }
  const std::string as_given = config::to_toml(c);
  // Checked (run.out_dir made, old checkpoints refused) before anything is written.
  const config::TrainConfig prepared = app::prepare_program(c, o.config_path);
  // The config as run, next to the metrics (written by the main process only).
  if (comm::discover_launch_environment().rank == 0 && !c.run.out_dir.empty())
    std::ofstream(std::filesystem::path(c.run.out_dir) / "config.toml")
        << "# distjax train " << o.config_path
        << " (with its --set / --out / --resume / --overwrite)\n"
        << as_given;
  return app::train_prepared(prepared);
}

void add_train(CLI::App& cli, Command& command) {
  auto o = std::make_shared<TrainOptions>();
  std::string models;
  for (const app::ModelSpec& m : app::models())
    models += "\n  " + m.name + ": " + m.about;
  CLI::App* cmd = cli.add_subcommand("train", "Runs the training a TOML config describes");
  cmd->footer("Models (run.program):" + models +
              "\nUnder mpirun or srun it runs one device per process. See docs/configs.md.");
  cmd->add_option("config", o->config_path, "the TOML config file (see docs/configs.md)")
      ->required();
  cmd->add_option("--set", o->overrides,
                  "override one key, typed by the schema: --set run.steps=100 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--out", o->out_dir, "output directory (overrides run.out_dir)");
  // A flag with an optional value: --resume, --resume=auto (never the next argument).
  cmd->add_flag("--resume{true}", o->resume,
                "continue from the latest checkpoint, which must exist; --resume=auto: when "
                "there is one, else start afresh (sets run.resume)")
      ->check(CLI::IsMember({"true", "false", "auto"}));
  cmd->add_flag("--overwrite", o->overwrite,
                "start afresh in an out_dir that holds checkpoints, removing them (sets "
                "run.overwrite)");
  cmd->add_flag("--print-config", o->print_config,
                "print the config with every key (after --set) as TOML and exit");
  cmd->callback([o, &command] { command = [o] { return train(*o); }; });
}

void add_ckpt(CLI::App& cli, Command& command) {
  CLI::App* ckpt = cli.add_subcommand("ckpt", "Checkpoint tools (see docs/checkpoints.md)");
  ckpt->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect",
      "Prints a checkpoint's index: step, mesh, and every tensor's shape, dtype, "
      "spec and files");
  inspect
      ->add_option("dir", *dir,
                   "a step directory, or a run's checkpoint directory (its latest step)")
      ->required();
  inspect->callback([dir, &command] {
    command = [dir] {
      train::inspect_checkpoint(*dir, std::cout);
      return 0;
    };
  });
}

void add_data(CLI::App& cli, Command& command) {
  CLI::App* data_cmd = cli.add_subcommand("data", "Data tools (see docs/training.md#data)");
  data_cmd->require_subcommand(1);
  struct Prepare {
    std::string text = data::kFortunesDir;
    std::string out;
    double validation_fraction = 0.05;
    std::int64_t shard_tokens = std::int64_t{100} << 20;
  };
  auto o = std::make_shared<Prepare>();
  CLI::App* prepare =
      data_cmd->add_subcommand("prepare",
                               "Writes a directory of text files as byte-level llm.c token shards "
                               "(train_*.bin, val_*.bin) for data.format = \"tokens\"");
  prepare->add_option("--text", o->text, "directory of text files (default: the fortunes)");
  prepare->add_option("--out", o->out, "directory the shards go to")->required();
  prepare
      ->add_option("--validation-fraction", o->validation_fraction,
                   "the last fraction of the bytes held out as the validation split")
      ->check(CLI::Range(0.0, 1.0));
  prepare->add_option("--shard-tokens", o->shard_tokens, "tokens per shard at most")
      ->check(CLI::PositiveNumber);
  prepare->callback([o, &command] {
    command = [o] {
      const data::ByteCorpus corpus =
          data::ByteCorpus::from_bytes(data::read_text_files(o->text), o->validation_fraction);
      const std::vector<std::string> files =
          data::write_byte_shards(corpus.train, corpus.validation, o->out, o->shard_tokens);
      std::printf(
          "Wrote %zu shards of byte tokens (vocabulary 256) to %s: %zu train / %zu "
          "validation tokens\n",
          files.size(), o->out.c_str(), corpus.train.size(), corpus.validation.size());
      std::printf(
          "Train on them with:\n  --set data.format=tokens --set data.train='%s/train_*.bin' "
          "--set data.val='%s/val_*.bin' --set model.vocab=256\n",
          o->out.c_str(), o->out.c_str());
      return 0;
    };
  });
}

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  double budget_gib = 80;
  std::string recompute;  // "" = from parallelism.remat
  int state_bytes = 4;
  bool no_master_weights = false;
  int max_rows = 20;
};

int plan_command(const PlanOptions& o) {
  config::TrainConfig c = config::load_config(o.config_path, o.overrides);
  for (const std::string& n : c.notices)
    std::fprintf(stderr, "[config] note: %s\n", n.c_str());
  c.distributed = config::resolve(c.distributed, comm::LaunchEnvironment{});
  c.validate(o.config_path);
  const plan::ModelDescription model = plan::model_from_config(c);
  plan::Setup setup = plan::setup_from_config(c);
  if (o.recompute == "none") setup.recompute = plan::Recompute::None;
  if (o.recompute == "selective") setup.recompute = plan::Recompute::Selective;
  if (o.recompute == "full") setup.recompute = plan::Recompute::Full;
  setup.state_bytes = o.state_bytes;
  if (o.no_master_weights) setup.master_weights = false;
  const plan::Plan p = plan::make_plan(model, setup);
  std::printf("distjax plan %s\n%s", o.config_path.c_str(), p.str().c_str());
  try {
    app::check_program(c);
  } catch (const Error& e) {
    std::printf("note: the program refuses this config as it is:\n%s\n", e.what());
  }
  // Only what the program runs: its axes, ZeRO stages and FSDP, at the config's precision.
  const config::ProgramCapabilities runs =
      app::find_model(c.run.program).capabilities.for_config(c);
  const double budget = o.budget_gib * 1024.0 * 1024.0 * 1024.0;
  const std::vector<plan::Plan> fits =
      plan::meshes_that_fit(model, setup, setup.world(), budget, runs);
  std::printf(
      "meshes of %d devices that fit %.0f GiB per device, of those %s runs (%s): %zu, "
      "smallest total first:\n",
      setup.world(), o.budget_gib, c.run.program.c_str(), runs.str().c_str(), fits.size());
  std::printf("  %-32s %10s %10s %10s %10s %10s %12s\n", "mesh", "params", "grads", "optim",
              "activ", "total GiB", "comm GB/step");
  const double g = 1024.0 * 1024.0 * 1024.0;
  int shown = 0;
  for (const plan::Plan& f : fits) {
    if (shown++ == o.max_rows) break;
    std::printf("  %-32s %10.2f %10.2f %10.2f %10.2f %10.2f %12.2f\n",
                plan::describe_setup(f.setup).c_str(), f.parameters / g, f.gradients / g,
                f.optimizer_state / g, f.activations / g, f.total() / g, f.comm_bytes() / 1e9);
  }
  if (fits.empty()) std::printf("  none\n");
  return 0;
}

void add_plan(CLI::App& cli, Command& command) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = cli.add_subcommand(
      "plan", "Predicts per-device memory and communication of a config, and the meshes that fit");
  cmd->footer(
      "Models: run.program gpt / train_gpt (model.vocab, d_model, layers, heads, "
      "data.seq_len) and data_parallelism / train_mnist. See docs/plan.md.");
  cmd->add_option("config", o->config_path, "the TOML config file (see docs/configs.md)")
      ->required();
  cmd->add_option("--set", o->overrides, "override one key: --set distributed.mesh_shape=4,2")
      ->allow_extra_args(false);
  cmd->add_option("--budget-gib", o->budget_gib, "memory per device for the meshes that fit")
      ->capture_default_str();
  cmd->add_option("--recompute", o->recompute,
                  "activation recomputation: none, selective, full (default: parallelism.remat)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--state-bytes", o->state_bytes,
                  "bytes of an optimizer-state element (4 f32; 2: 16-bit moments)")
      ->capture_default_str();
  cmd->add_flag("--no-master-weights", o->no_master_weights,
                "16-bit precision without an f32 master copy in the optimizer state");
  cmd->add_option("--max-rows", o->max_rows, "meshes listed at most")->capture_default_str();
  cmd->callback([o, &command] { command = [o] { return plan_command(*o); }; });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"distjax: distributed training with DistJax"};
  cli.require_subcommand(1);
  Command command;
  add_train(cli, command);
  add_ckpt(cli, command);
  add_data(cli, command);
  add_plan(cli, command);
  if (const std::optional<int> stop = tools::parse_command_line(cli, argc, argv)) return *stop;
  return app::run_main("distjax", command);
}
