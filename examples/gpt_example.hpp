// The flags of the GPT examples (fsdp, tensor_parallel_gpt): the GPT on the fortunes
// corpus over a ("data", "model") mesh, data parallel over "data" (optionally with fully
// sharded parameters, ZeRO-3 / FSDP, and remat), tensor parallel over "model" in any
// layout. The flags fill the config of configs/<program>.toml; the program is
// examples/programs/gpt.cpp.
#pragma once

#include <string>

#include "distjax/data/text_corpus.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

namespace distjax::examples {

/// The defaults a program starts from (its flags override them).
struct GptExampleDefaults {
  long long data = 2, model = 4;
  std::string layout = "megatron";
  long long fsdp = 0;
};

inline int run_gpt_example(int argc, char** argv, const char* program,
                           const GptExampleDefaults& d) {
  config::TrainConfig c = program_defaults("gpt");
  c.run.out_dir = std::string("runs/") + program;
  c.parallelism.tp_layout = d.layout;
  c.data.dir = data::kFortunesDir;
  long long n_data = d.data, n_model = d.model, fsdp = d.fsdp;
  std::string backend = "auto";
  Args args(program, "the GPT on the fortunes corpus over a (data, model) mesh");
  args.bind("data", &n_data, "devices along \"data\" (data parallel)");
  args.bind("model", &n_model, "devices along \"model\" (tensor parallel)");
  args.bind("layout", &c.parallelism.tp_layout,
            "tensor-parallel layout: megatron, gather, async or none");
  args.bind("sequence-parallel", &c.parallelism.sequence_parallel, "megatron: 1 = split T");
  args.bind("vocab-parallel", &c.parallelism.vocab_parallel,
            "megatron: 1 = vocabulary-parallel head");
  args.bind("bidirectional", &c.parallelism.bidirectional, "async: 1 = rings both ways");
  args.bind("fsdp", &fsdp, "1 = parameters fully sharded over \"data\" (and blocks remat)");
  args.bind("steps", &c.run.steps, "optimizer steps");
  args.bind("batch-size", &c.run.batch_size, "global sequences per step");
  args.bind("seq-len", &c.data.seq_len, "bytes per sequence (T)");
  args.bind("d-model", &c.model.d_model, "model width (C)");
  args.bind("layers", &c.model.layers, "transformer blocks (L)");
  args.bind("heads", &c.model.heads, "attention heads (H)");
  args.bind("min-weight-size", &c.parallelism.fsdp.min_weight_size,
            "parameters with fewer elements stay replicated");
  args.bind("lr", &c.optimizer.lr, "peak learning rate of AdamW");
  args.bind("log-every", &c.run.log_every, "steps between progress lines");
  args.bind("out", &c.run.out_dir, "output directory");
  args.bind("overwrite", &c.run.overwrite,
            "1 = start afresh over the checkpoints in --out, removing them");
  args.bind("corpus", &c.data.dir, "directory of text files");
  args.bind("backend", &backend,
            "auto, threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);
  if (!parse_backend(program, backend, &c.distributed.backend)) return 2;
  c.distributed.mesh_shape = {static_cast<int>(n_data), static_cast<int>(n_model)};
  c.distributed.tensor_parallel_size = static_cast<int>(n_model);
  c.distributed.world_size = 0;  // the mesh's (or the launcher's, checked against the mesh)
  c.parallelism.fsdp.modules = fsdp ? std::vector<std::string>{"*"} : std::vector<std::string>{};
  // A block's gathered weights live only while it runs.
  c.parallelism.remat = fsdp ? std::vector<std::string>{"Block"} : std::vector<std::string>{};
  return run_program(c);
}

}  // namespace distjax::examples
