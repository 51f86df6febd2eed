// The main job of DistJax (`make run`): trains the MLP Classifier on Fashion-MNIST,
// data-parallel over --devices simulated devices (a ("data"=N) mesh; each device
// trains on its slice of every global batch and gradients are averaged over "data"),
// with AdamW and a warmup + cosine learning-rate schedule. Evaluates on the test set
// after every epoch and writes metrics.jsonl and summary.json into --out.
//
//   ./build/train_mnist --out runs/mnist [--devices 2 --epochs 10 --batch-size 128 --lr 2e-3]
//   mpirun -np 2 ./build/train_mnist --backend mpi     (one process per device)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"
#include "example_common.hpp"

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

// Loss function of the classifier: mean cross-entropy, plus accuracy as (correct, B).
train::LossFn make_loss(const models::Classifier& model, bool train) {
  return [&model, train](const TensorTree& params, const train::Batch& batch, Key rng) {
    return examples::classification_loss(model.apply(params, batch.inputs, train, rng),
                                         batch.labels);
  };
}

int run(int argc, char** argv) {
  examples::Args args("train_mnist", "trains the MLP classifier on Fashion-MNIST (single device)");
  std::string& out = args.flag("out", std::string("runs/mnist"), "output directory");
  long long& epochs = args.flag("epochs", 10LL, "passes over the 60,000 training images");
  long long& batch_size = args.flag("batch-size", 128LL, "examples per step");
  double& lr = args.flag("lr", 2e-3, "peak learning rate of AdamW");
  double& weight_decay = args.flag("weight-decay", 1e-4, "AdamW decoupled weight decay");
  long long& hidden = args.flag("hidden", 512LL, "hidden units of the MLP");
  double& dropout = args.flag("dropout", 0.1, "dropout rate after the hidden layer");
  long long& warmup = args.flag("warmup-steps", 200LL, "linear warmup steps");
  long long& log_every = args.flag("log-every", 100LL, "steps between progress lines");
  long long& seed = args.flag("seed", 0LL, "seed of initialisation, shuffling and dropout");
  std::string& data_dir = args.flag("data", std::string(data::kFashionMnistDir),
                                    "directory of the Fashion-MNIST IDX files");
  long long& devices = args.flag("devices", 2LL, "data-parallel devices (threads, or MPI ranks)");
  std::string& backend_name =
      args.flag("backend", examples::default_backend(),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  comm::Backend backend;
  if (!examples::parse_backend("train_mnist", backend_name, &backend)) return 2;
  if (backend == comm::Backend::Mpi && examples::mpi_world_size() > 0)
    devices = examples::mpi_world_size();
  if (devices < 1 || batch_size % devices != 0) {
    std::fprintf(stderr, "train_mnist: --batch-size %lld must be divisible by --devices %lld\n",
                 batch_size, devices);
    return 2;
  }

  const mesh::Mesh mesh({static_cast<int>(devices)}, {"data"});
  if (examples::main_process()) {
    std::printf("Mesh (%s backend):\n%s\n", backend_name.c_str(), mesh.to_string().c_str());
    std::printf("Loading Fashion-MNIST from %s\n", data_dir.c_str());
  }
  const data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  const data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  const std::vector<train::Batch> all_test_batches = test_set.batches(1000);

  models::Classifier model({.in_features = 784,
                            .hidden = hidden,
                            .num_classes = 10,
                            .dropout = static_cast<float>(dropout)});
  const std::int64_t steps_per_epoch =
      data::DataLoader(train_set, {.batch_size = batch_size}).batches_per_epoch();
  const std::int64_t total_steps = epochs * steps_per_epoch;
  optim::AdamW opt(
      {.learning_rate = optim::warmup_cosine_schedule(
           0.0, lr, std::min<std::int64_t>(warmup, total_steps - 1), total_steps, lr * 0.01),
       .weight_decay = weight_decay,
       .decay_mask = optim::default_decay_mask()});
  const Key root = Key::from_seed(static_cast<std::uint64_t>(seed));
  const train::LossFn train_loss = make_loss(model, true);
  const train::LossFn eval_loss = make_loss(model, false);

  // The per-device program: every device holds the whole model (replicated over
  // "data"), reads its slice of each global batch, and averages gradients over "data".
  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    data::DataLoader loader(train_set, {.batch_size = batch_size,
                                        .seed = static_cast<std::uint64_t>(seed),
                                        .num_shards = static_cast<int>(devices),
                                        .shard_index = replica});
    std::vector<train::Batch> test_batches;  // this replica's share of the test set
    for (std::size_t i = replica; i < all_test_batches.size(); i += devices)
      test_batches.push_back(all_test_batches[i]);
    // Same key on every device: identical initial parameters on every replica.
    train::TrainState state =
        train::TrainState::create(model.init(root.fold_in(std::string_view("init"))), opt,
                                  root.fold_in(std::string_view("dropout")));
    if (lead)
      std::printf(
          "Classifier 784-%lld-10: %lld parameters | train %lld, test %lld images | %lld epochs x "
          "%lld steps, global batch %lld = %lld devices x %lld\n",
          static_cast<long long>(hidden), static_cast<long long>(state.params.num_elements()),
          static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()), epochs,
          static_cast<long long>(steps_per_epoch), batch_size, devices, batch_size / devices);
    parallel::DataParallel dp(ctx, "data");
    train::Trainer trainer({.out_dir = lead ? out : std::string(),
                            .total_steps = total_steps,
                            .log_every = log_every,
                            .mesh = "data=" + std::to_string(devices),
                            .backend = backend_name,
                            .print = lead},
                           opt, train_loss, {.strategy = &dp});
    for (long long e = 0; e < epochs; ++e) {
      for (std::int64_t s = 0; s < steps_per_epoch; ++s)
        trainer.step(state, loader.next());
      trainer.evaluate(state, test_batches, eval_loss);
    }
    const double acc = trainer.last_eval().at("accuracy");
    const double loss = trainer.last_eval().at("loss");
    trainer.finish(state, {{"test_accuracy", acc},
                           {"test_loss", loss},
                           {"epochs", double(epochs)},
                           {"batch_size", double(batch_size)},
                           {"devices", double(devices)}});
    if (lead)
      std::printf("Final test accuracy: %.2f%% (loss %.4f) after %lld epochs on %lld devices\n",
                  100.0 * acc, loss, epochs, devices);
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::examples::run_main("train_mnist", [&] { return run(argc, argv); });
}
