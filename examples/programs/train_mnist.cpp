// Program train_mnist (`make run`): the MLP Classifier on Fashion-MNIST, data-parallel
// over a ("data"=N) mesh (each device trains on its slice of every global batch, gradients
// averaged over "data"), AdamW with warmup + cosine; evaluates on the test set after every
// epoch (or every run.eval_every steps) and writes metrics.jsonl and summary.json.
#include <algorithm>
#include <cstdio>

#include "distjax/config/distributed_config.hpp"
#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/trainer.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

namespace distjax::examples {

using tensor::Tensor;
using tensor::TensorTree;

void check_train_mnist(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  DISTJAX_CHECK(mesh.ndim() == 1, ConfigError, "[train_mnist] runs on a (\"data\") mesh, got ",
                mesh.describe());
}

int run_train_mnist(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  const int devices = mesh.size();
  const std::string backend_name = backend_label(c);
  const std::string data_dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  const bool main = c.distributed.is_main_process();
  if (main) {
    std::printf("Mesh (%s backend):\n%s\n", backend_name.c_str(), mesh.to_string().c_str());
    std::printf("Loading Fashion-MNIST from %s\n", data_dir.c_str());
  }
  const data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  const data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  const std::vector<train::Batch> all_test_batches = test_set.batches(1000);

  const std::int64_t batch_size = c.run.batch_size;
  const models::Classifier model({.in_features = 784,
                                  .hidden = c.model.hidden,
                                  .num_classes = 10,
                                  .dropout = static_cast<float>(c.model.dropout)});
  const std::int64_t steps_per_epoch =
      data::DataLoader(train_set, {.batch_size = batch_size}).batches_per_epoch();
  const std::int64_t total_steps = c.run.steps > 0 ? c.run.steps : c.run.epochs * steps_per_epoch;
  // Evaluate after every epoch unless run.eval_every says otherwise, and at the end.
  const std::int64_t eval_every = c.run.eval_every > 0 ? c.run.eval_every : steps_per_epoch;
  const optim::AdamW opt = make_adamw(c, total_steps);
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const Key root = Key::from_seed(seed);
  const auto make_loss = [&model](bool train) -> train::LossFn {
    return [&model, train](const TensorTree& params, const train::Batch& batch, Key rng) {
      return classification_loss(model.apply(params, batch.inputs, train, rng), batch.labels);
    };
  };
  const train::LossFn train_loss = make_loss(true);
  const train::LossFn eval_loss = make_loss(false);

  // The per-device program: every device holds the whole model (replicated over
  // "data"), reads its slice of each global batch, and averages gradients over "data".
  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    data::DataLoader loader(
        train_set,
        {.batch_size = batch_size, .seed = seed, .num_shards = devices, .shard_index = replica});
    std::vector<train::Batch> test_batches;  // this replica's share of the test set
    for (std::size_t i = replica; i < all_test_batches.size(); i += devices)
      test_batches.push_back(all_test_batches[i]);
    // Same key on every device: identical initial parameters on every replica.
    train::TrainState state =
        train::TrainState::create(model.init(root.fold_in(std::string_view("init"))), opt,
                                  root.fold_in(std::string_view("dropout")));
    if (lead)
      std::printf(
          "Classifier 784-%lld-10: %lld parameters | train %lld, test %lld images | %lld steps "
          "(%lld per epoch), global batch %lld = %d devices x %lld\n",
          static_cast<long long>(c.model.hidden),
          static_cast<long long>(state.params.num_elements()),
          static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
          static_cast<long long>(total_steps), static_cast<long long>(steps_per_epoch),
          static_cast<long long>(batch_size), devices,
          static_cast<long long>(batch_size / devices));
    parallel::DataParallel dp(ctx, "data");
    RunCheckpoints ckpt(c, {&ctx, nullptr, &dp}, state, loader, lead);
    train::Trainer trainer({.out_dir = lead ? c.run.out_dir : std::string(),
                            .total_steps = total_steps,
                            .log_every = c.run.log_every,
                            .mesh = "data=" + std::to_string(devices),
                            .backend = backend_name,
                            .print = lead,
                            .append = ckpt.resumed(),
                            .timeline_file = timeline_file(c, ctx.device()),
                            .device = ctx.device()},
                           opt, train_loss,
                           {.num_minibatches = static_cast<int>(c.run.grad_accum_steps),
                            .max_grad_norm = c.optimizer.max_grad_norm,
                            .strategy = &dp});
    while (state.step < total_steps) {
      trainer.step(state, loader.next());
      ckpt.after_step(state);
      if (state.step % eval_every == 0 || state.step == total_steps)
        trainer.evaluate(state, test_batches, eval_loss);
    }
    ckpt.finish(state);
    if (trainer.last_eval().empty()) trainer.evaluate(state, test_batches, eval_loss);  // resumed at the end
    const double acc = trainer.last_eval().at("accuracy");
    const double loss = trainer.last_eval().at("loss");
    const double epochs = static_cast<double>(total_steps) / static_cast<double>(steps_per_epoch);
    trainer.finish(state, {{"test_accuracy", acc},
                           {"test_loss", loss},
                           {"epochs", epochs},
                           {"batch_size", double(batch_size)},
                           {"devices", double(devices)}});
    if (lead)
      std::printf("Final test accuracy: %.2f%% (loss %.4f) after %.4g epochs on %d devices\n",
                  100.0 * acc, loss, epochs, devices);
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {},
                  {.backend = c.distributed.comm_backend()})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::examples
