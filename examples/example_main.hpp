// main() of the example binaries: each starts from its config (configs/<name>.toml, built
// into the library: app::builtin_config), takes flags that set config keys (typed by the
// config schema, so `--steps abc` names the key it breaks), and runs the program the config
// names, as `distjax train configs/<name>.toml --set ...` does. Flags parsed by CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "distjax/app/train.hpp"
#include "distjax/config/config_file.hpp"
#include "../tools/parse_command_line.hpp"

namespace distjax::examples {

/// --<flag> VALUE sets the config key `key`.
struct KeyFlag {
  std::string flag;
  std::string key;
  std::string help;
};

/// What an example adds to the flags every example has: its key flags, flags of its own
/// (`more`, declared on the CLI11 app), and `adjust`, run on the config after the flags are
/// applied (flags that set several keys); `options`, what app::train shows beyond its usual
/// lines.
struct Example {
  std::string name;  ///< the binary and its config
  std::string about;
  std::vector<KeyFlag> flags;
  std::function<void(CLI::App&)> more = {};
  std::function<void(config::TrainConfig&)> adjust = {};
  /// What app::train shows beyond its usual lines (read after the flags are parsed).
  std::function<app::TrainOptions()> options = {};
};

/// --data N and --model N of the examples on a ("data", "model") mesh (0: as the config).
struct DataModelMesh {
  int data = 0, model = 0;
  void add_flags(CLI::App& cli) {
    cli.add_option("--data", data, "devices along \"data\" (data parallel)");
    cli.add_option("--model", model, "devices along \"model\" (tensor parallel)");
  }
  void apply(config::TrainConfig& c) const {
    auto& d = c.distributed;
    const int n_model = model > 0 ? model : std::max(1, d.tensor_parallel_size);
    const int n_data = data > 0 ? data : (d.mesh_shape.empty() ? 1 : d.mesh_shape[0]);
    d.mesh_shape = {n_data, n_model};
    d.tensor_parallel_size = n_model;
    d.world_size = 0;  // the mesh's (or the launcher's, checked against the mesh)
  }
};

/// The flags of the GPT examples (fsdp, tensor_parallel_gpt) beside --data and --model.
inline std::vector<KeyFlag> gpt_flags() {
  return {{"layout", "parallelism.tp_layout", "tensor-parallel layout: megatron, gather, async or none"},
          {"sequence-parallel", "parallelism.sequence_parallel", "megatron: true = split T"},
          {"vocab-parallel", "parallelism.vocab_parallel", "megatron: true = vocabulary-parallel head"},
          {"bidirectional", "parallelism.bidirectional", "async: true = rings both ways"},
          {"steps", "run.steps", "optimizer steps"},
          {"batch-size", "run.batch_size", "global sequences per step"},
          {"seq-len", "data.seq_len", "bytes per sequence (T)"},
          {"d-model", "model.d_model", "model width (C)"},
          {"layers", "model.layers", "transformer blocks (L)"},
          {"heads", "model.heads", "attention heads (H)"},
          {"min-weight-size", "parallelism.fsdp.min_weight_size",
           "parameters with fewer elements stay replicated"},
          {"lr", "optimizer.lr", "peak learning rate of AdamW"},
          {"log-every", "run.log_every", "steps between progress lines"},
          {"corpus", "data.dir", "directory of text files"}};
}

/// The flags of the TP classifier examples (tensor_parallelism, tensor_parallelism_async).
inline std::vector<KeyFlag> tp_classifier_flags() {
  return {{"steps", "run.steps", "optimizer steps"},
          {"batch-size", "run.batch_size", "global batch (split over \"data\")"},
          {"hidden", "model.hidden", "hidden width (divisible by --model)"},
          {"layers", "model.layers", "TP MLP blocks"},
          {"dropout", "model.dropout", "dropout rate in the blocks"},
          {"bidirectional", "parallelism.bidirectional", "async: true = rings both ways"},
          {"log-every", "run.log_every", "steps between progress lines"},
          {"data-dir", "data.dir", "directory of the Fashion-MNIST IDX files"}};
}

/// Parses argv (--help lists every flag; a bad flag exits 2 with CLI11's message and a "did
/// you mean" line where one is near: tools/parse_command_line.hpp), applies
/// the flags to the built-in config and runs it; errors print "<name>: <message>", exit 1.
inline int example_main(int argc, char** argv, const Example& e) {
  CLI::App cli{e.name + ": " + e.about + " (starts from configs/" + e.name + ".toml)"};
  std::vector<std::string> sets;
  std::vector<std::string> values(e.flags.size());
  for (std::size_t i = 0; i < e.flags.size(); ++i)
    cli.add_option("--" + e.flags[i].flag, values[i], e.flags[i].help + " [" + e.flags[i].key + "]")
        ->type_name("VALUE");
  std::string out, backend, resume;
  bool overwrite = false;
  cli.add_option("--out", out, "output directory [run.out_dir]");
  cli.add_flag("--overwrite", overwrite, "start afresh over the checkpoints in --out, removing them");
  cli.add_flag("--resume{true}", resume,
               "continue from the latest checkpoint; --resume=auto: when there is one")
      ->check(CLI::IsMember({"true", "false", "auto"}));
  cli.add_option("--backend", backend,
                 "auto, threads (simulated devices in this process) or mpi (one process per "
                 "device) [distributed.backend]");
  cli.add_option("--set", sets, "override any config key: --set run.steps=100 (repeatable)")
      ->allow_extra_args(false);
  if (e.more) e.more(cli);
  if (const std::optional<int> stop = tools::parse_command_line(cli, argc, argv)) return *stop;
  return app::run_main(e.name.c_str(), [&] {
    config::TrainConfig c = app::builtin_config(e.name);
    for (std::size_t i = 0; i < e.flags.size(); ++i)
      if (!values[i].empty()) config::apply_override(c, e.flags[i].key + "=" + values[i]);
    if (!out.empty()) c.run.out_dir = out;
    if (overwrite) c.run.overwrite = true;
    if (!resume.empty()) config::apply_override(c, "run.resume=" + resume);
    if (!backend.empty()) config::apply_override(c, "distributed.backend=" + backend);
    if (e.adjust) e.adjust(c);
    for (const std::string& s : sets)
      config::apply_override(c, s);
    return app::train(c, "configs/" + e.name + ".toml", e.options ? e.options() : app::TrainOptions{});
  });
}

}  // namespace distjax::examples
