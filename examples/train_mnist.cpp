// The main job of DistJax (`make run`): trains the MLP Classifier on Fashion-MNIST,
// data-parallel over --devices simulated devices (a ("data"=N) mesh; each device
// trains on its slice of every global batch and gradients are averaged over "data"),
// with AdamW and a warmup + cosine learning-rate schedule. Evaluates on the test set
// after every epoch and writes metrics.jsonl and summary.json into --out.
// The flags fill the config of configs/train_mnist.toml (`distjax train` runs the same
// program, examples/programs/train_mnist.cpp).
//
//   ./build/train_mnist --out runs/mnist [--devices 2 --epochs 10 --batch-size 128 --lr 2e-3]
//   mpirun -np 2 ./build/train_mnist --backend mpi     (one process per device)
#include "distjax/data/fashion_mnist.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

using namespace distjax;

int main(int argc, char** argv) {
  return examples::run_main("train_mnist", [&] {
    config::TrainConfig c = examples::program_defaults("train_mnist");
    c.data.dir = data::kFashionMnistDir;
    std::string backend = "auto";
    examples::Args args("train_mnist", "trains the MLP classifier on Fashion-MNIST");
    args.bind("out", &c.run.out_dir, "output directory");
    args.bind("overwrite", &c.run.overwrite,
              "1 = start afresh over the checkpoints in --out, removing them");
    args.bind("epochs", &c.run.epochs, "passes over the 60,000 training images");
    args.bind("batch-size", &c.run.batch_size, "examples per step");
    args.bind("lr", &c.optimizer.lr, "peak learning rate of AdamW");
    args.bind("weight-decay", &c.optimizer.weight_decay, "AdamW decoupled weight decay");
    args.bind("hidden", &c.model.hidden, "hidden units of the MLP");
    args.bind("dropout", &c.model.dropout, "dropout rate after the hidden layer");
    args.bind("warmup-steps", &c.optimizer.warmup_steps, "linear warmup steps");
    args.bind("log-every", &c.run.log_every, "steps between progress lines");
    args.bind("seed", &c.run.seed, "seed of initialisation, shuffling and dropout");
    args.bind("data", &c.data.dir, "directory of the Fashion-MNIST IDX files");
    args.bind("devices", &c.distributed.world_size,
              "data-parallel devices (threads; under mpirun the number of processes)");
    args.bind("backend", &backend,
              "auto, threads (simulated devices in this process) or mpi (one process per device)");
    args.parse(argc, argv);
    if (!examples::parse_backend("train_mnist", backend, &c.distributed.backend)) return 2;
    return examples::run_program(c);
  });
}
