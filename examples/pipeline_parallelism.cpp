// Pipeline parallelism on real data: the PPClassifier (an input Dense, residual MLP
// blocks cut into stages, LayerNorm + Dense head) on Fashion-MNIST over a ("data"=2,
// "pipe"=4) mesh of simulated devices, micro-batches run by a checked schedule (1F1B by
// default; GPipe, interleaved 1F1B, ZB-H1). Prints "[PP] Step i: Loss = ..." lines, the
// test accuracy and the measured bubble; with --show-schedule also the schedule's
// timeline and the measured per-stage timeline of the last step. The flags fill the
// config of configs/pipeline_parallelism.toml (program
// examples/programs/pipeline_parallelism.cpp).
//
//   ./build/pipeline_parallelism [--data 2 --pipe 4 --schedule 1f1b --microbatches 8]
//   ./build/pipeline_parallelism --schedule zbh1 --show-schedule 1
//   mpirun -np 8 ./build/pipeline_parallelism          (one process per device)
#include <string>

#include "distjax/data/fashion_mnist.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

using namespace distjax;

int main(int argc, char** argv) {
  return examples::run_main("pipeline_parallelism", [&] {
    config::TrainConfig c = examples::program_defaults("pipeline_parallelism");
    c.data.dir = data::kFashionMnistDir;
    long long n_data = 2, n_pipe = 4, show = 0;
    std::string backend = "auto";
    examples::Args args("pipeline_parallelism",
                        "the pipeline-parallel MLP classifier on Fashion-MNIST");
    args.bind("data", &n_data, "devices along \"data\" (data parallel)");
    args.bind("pipe", &n_pipe, "devices along \"pipe\" (pipeline stages)");
    args.bind("schedule", &c.parallelism.schedule, "gpipe, 1f1b, interleaved, zbh1 or interleaved_zb");
    args.bind("microbatches", &c.parallelism.microbatches, "micro-batches per step (m)");
    args.bind("virtual-stages", &c.parallelism.virtual_stages, "chunks per stage (interleaved schedules; 2 by default there)");
    args.bind("layers", &c.model.layers, "residual MLP blocks, cut over the stages");
    args.bind("hidden", &c.model.hidden, "width of the blocks");
    args.bind("steps", &c.run.steps, "optimizer steps");
    args.bind("batch-size", &c.run.batch_size, "global batch (split over \"data\")");
    args.bind("log-every", &c.run.log_every, "steps between progress lines");
    args.bind("show-schedule", &show,
              "1: print the schedule and the measured timeline of the last step");
    args.bind("out", &c.run.out_dir, "output directory");
    args.bind("overwrite", &c.run.overwrite,
              "1 = start afresh over the checkpoints in --out, removing them");
    args.bind("data-dir", &c.data.dir, "directory of the Fashion-MNIST IDX files");
    args.bind("backend", &backend,
              "auto, threads (simulated devices in this process) or mpi (one process per device)");
    args.parse(argc, argv);
    if (!examples::parse_backend("pipeline_parallelism", backend, &c.distributed.backend)) return 2;
    if ((c.parallelism.schedule == "interleaved" || c.parallelism.schedule == "interleaved_zb") &&
        c.parallelism.virtual_stages == 1)
      c.parallelism.virtual_stages = 2;
    c.distributed.world_size = static_cast<int>(n_data * n_pipe);
    c.distributed.pipeline_parallel_size = static_cast<int>(n_pipe);
    return examples::run_pipeline_parallelism(examples::prepare_program(c), show != 0);
  });
}
