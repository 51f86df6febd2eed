// The flags of the tensor_parallelism and tensor_parallelism_async examples: the
// toolkit's TP classifier on Fashion-MNIST over a ("data", "model") mesh (2 x 4 by
// default), with synchronous all-gathers / reduce-scatters or asynchronous ppermute
// rings. The flags fill the config of configs/<program>.toml; the program is
// examples/programs/tensor_parallelism.cpp.
#pragma once

#include <string>

#include "distjax/data/fashion_mnist.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

namespace distjax::examples {

inline int run_tensor_parallelism(int argc, char** argv, const char* program, bool async_rings) {
  config::TrainConfig c = program_defaults("tensor_parallelism");
  c.run.out_dir = std::string("runs/") + program;
  c.parallelism.tp_layout = async_rings ? "async" : "gather";
  c.data.dir = data::kFashionMnistDir;
  long long n_data = 2, n_model = 4;
  std::string backend = "auto";
  Args args(program, async_rings ? "the TP classifier on Fashion-MNIST with async TP rings"
                                 : "the TP classifier on Fashion-MNIST (data x model mesh)");
  args.bind("data", &n_data, "devices along \"data\"");
  args.bind("model", &n_model, "devices along \"model\" (tensor parallel)");
  args.bind("steps", &c.run.steps, "optimizer steps");
  args.bind("batch-size", &c.run.batch_size, "global batch (split over \"data\")");
  args.bind("hidden", &c.model.hidden, "hidden width (divisible by --model)");
  args.bind("layers", &c.model.layers, "TP MLP blocks");
  args.bind("dropout", &c.model.dropout, "dropout rate in the blocks");
  args.bind("bidirectional", &c.parallelism.bidirectional, "async: 1 = rings both ways");
  args.bind("log-every", &c.run.log_every, "steps between progress lines");
  args.bind("out", &c.run.out_dir, "output directory");
  args.bind("overwrite", &c.run.overwrite,
            "1 = start afresh over the checkpoints in --out, removing them");
  args.bind("data-dir", &c.data.dir, "directory of the Fashion-MNIST IDX files");
  args.bind("backend", &backend,
            "auto, threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);
  if (!parse_backend(program, backend, &c.distributed.backend)) return 2;
  c.distributed.mesh_shape = {static_cast<int>(n_data), static_cast<int>(n_model)};
  c.distributed.tensor_parallel_size = static_cast<int>(n_model);
  c.distributed.world_size = 0;  // the mesh's (or the launcher's, checked against the mesh)
  return run_program(c);
}

}  // namespace distjax::examples
