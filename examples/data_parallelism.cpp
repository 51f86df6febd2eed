// The original toolkit's data_parallelism example, on real data: the MLP classifier on
// Fashion-MNIST over a ("data"=8) mesh of simulated devices, with its parameters fully
// sharded (ZeRO-3 / FSDP) by default, or plain data parallelism, ZeRO-1 or ZeRO-2.
// Prints the mesh, the sharding of every parameter, "[FSDP] Step i: Loss = ..., Accuracy
// = ..." lines, the test accuracy and the bytes each device holds. The flags fill the
// config of configs/data_parallelism.toml (program examples/programs/data_parallelism.cpp).
//
//   ./build/data_parallelism [--devices 8 --zero 3 --steps 300 --min-weight-size 262144]
//   mpirun -np 8 ./build/data_parallelism          (one process per device)
#include <cstdio>

#include "distjax/data/fashion_mnist.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

using namespace distjax;

int main(int argc, char** argv) {
  return examples::run_main("data_parallelism", [&] {
    config::TrainConfig c = examples::program_defaults("data_parallelism");
    c.data.dir = data::kFashionMnistDir;
    std::string backend = "auto";
    long long zero = 3;
    examples::Args args("data_parallelism",
                        "the MLP classifier on Fashion-MNIST, data parallel with ZeRO / FSDP");
    args.bind("devices", &c.distributed.world_size,
              "devices along \"data\" (threads; under mpirun the number of processes)");
    args.bind("zero", &zero, "0 plain data parallelism, 1 or 2 ZeRO, 3 FSDP");
    args.bind("steps", &c.run.steps, "optimizer steps");
    args.bind("batch-size", &c.run.batch_size, "global batch (split over devices)");
    args.bind("min-weight-size", &c.parallelism.fsdp.min_weight_size,
              "FSDP: parameters with fewer elements stay replicated");
    args.bind("log-every", &c.run.log_every, "steps between progress lines");
    args.bind("out", &c.run.out_dir, "output directory");
    args.bind("overwrite", &c.run.overwrite,
              "1 = start afresh over the checkpoints in --out, removing them");
    args.bind("data", &c.data.dir, "directory of the Fashion-MNIST IDX files");
    args.bind("backend", &backend,
              "auto, threads (simulated devices in this process) or mpi (one process per device)");
    args.parse(argc, argv);
    if (!examples::parse_backend("data_parallelism", backend, &c.distributed.backend)) return 2;
    if (zero < 0 || zero > 3) {
      std::fprintf(stderr, "data_parallelism: --zero must be 0, 1, 2 or 3, got %lld\n", zero);
      return 2;
    }
    c.parallelism.zero_stage = zero == 3 ? 0 : static_cast<int>(zero);
    c.parallelism.fsdp.modules =
        zero == 3 ? std::vector<std::string>{"*"} : std::vector<std::string>{};
    return examples::run_program(c);
  });
}
