// The main job of DistJax (`make run`): trains the MLP Classifier on Fashion-MNIST,
// data-parallel over --devices simulated devices (a ("data"=N) mesh; each device trains on
// its slice of every global batch and gradients are averaged over "data"), with AdamW and
// a warmup + cosine learning-rate schedule; evaluates on the test set after every epoch and
// writes metrics.jsonl and summary.json into --out. The model is "classifier", trained by
// app::train.
//
//   ./build/train_mnist --out runs/mnist [--devices 2 --epochs 10 --batch-size 128 --lr 2e-3]
//   mpirun -np 2 ./build/train_mnist --backend mpi     (one process per device)
#include "example_main.hpp"

int main(int argc, char** argv) {
  return distjax::examples::example_main(
      argc, argv,
      {.name = "train_mnist",
       .about = "trains the MLP classifier on Fashion-MNIST",
       .flags = {{"epochs", "run.epochs", "passes over the 60,000 training images"},
                 {"batch-size", "run.batch_size", "examples per step"},
                 {"lr", "optimizer.lr", "peak learning rate of AdamW"},
                 {"weight-decay", "optimizer.weight_decay", "AdamW decoupled weight decay"},
                 {"hidden", "model.hidden", "hidden units of the MLP"},
                 {"dropout", "model.dropout", "dropout rate after the hidden layer"},
                 {"warmup-steps", "optimizer.warmup_steps", "linear warmup steps"},
                 {"log-every", "run.log_every", "steps between progress lines"},
                 {"seed", "run.seed", "seed of initialisation, shuffling and dropout"},
                 {"data", "data.dir", "directory of the Fashion-MNIST IDX files"},
                 {"devices", "distributed.world_size",
                  "data-parallel devices (threads; under mpirun the number of processes)"}}});
}
