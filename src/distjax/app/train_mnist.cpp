// Program train_mnist (`make run`): the MLP Classifier on Fashion-MNIST, data-parallel
// over a ("data"=N) mesh (each device trains on its slice of every global batch, gradients
// averaged over "data"), AdamW with warmup + cosine; evaluates on the test set after every
// epoch (or every run.eval_every steps) and writes metrics.jsonl and summary.json.
#include <cstdio>

#include "distjax/app/model_specs.hpp"
#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/data/fashion_mnist.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

using tensor::Tensor;

void check_train_mnist(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  DISTJAX_CHECK(mesh.ndim() == 1, ConfigError, "[train_mnist] runs on a (\"data\") mesh, got ",
                mesh.describe());
}

int run_train_mnist(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  const int devices = mesh.size();
  const std::string data_dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  if (c.distributed.is_main_process()) {
    std::printf("Mesh (%s backend):\n%s\n", backend_label(c).c_str(), mesh.to_string().c_str());
    std::printf("Loading Fashion-MNIST from %s\n", data_dir.c_str());
  }
  const FashionMnist mnist = load_fashion_mnist(c);
  const data::ArrayDataset& train_set = mnist.train;
  const data::ArrayDataset& test_set = mnist.test;
  const std::vector<train::Batch> test_batches = test_set.batches(1000);
  const std::int64_t batch_size = c.run.batch_size;
  const models::Classifier model({.in_features = 784,
                                  .hidden = c.model.hidden,
                                  .num_classes = 10,
                                  .dropout = static_cast<float>(c.model.dropout)});
  const std::int64_t steps_per_epoch =
      data::DataLoader(train_set, {.batch_size = batch_size}).batches_per_epoch();
  const std::int64_t total_steps = c.run.steps > 0 ? c.run.steps : c.run.epochs * steps_per_epoch;
  const optim::AdamW opt = make_adamw(c, total_steps);
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const Key root = Key::from_seed(seed);

  // Every device holds the whole model (replicated over "data"), reads its slice of each
  // global batch, and averages gradients over "data".
  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    Composed composed(c, &ctx, classifier_spec(model));
    // Same key on every device: identical initial parameters on every replica.
    train::TrainState state = composed.create_state(opt, root.fold_in(std::string_view("init")),
                                                    root.fold_in(std::string_view("dropout")));
    if (ctx.device() == 0)
      std::printf(
          "Classifier 784-%lld-10: %lld parameters | train %lld, test %lld images | %lld steps "
          "(%lld per epoch), global batch %lld = %d devices x %lld\n",
          static_cast<long long>(c.model.hidden), static_cast<long long>(state.params.num_elements()),
          static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
          static_cast<long long>(total_steps), static_cast<long long>(steps_per_epoch),
          static_cast<long long>(batch_size), devices, static_cast<long long>(batch_size / devices));
    data::DataLoader loader(
        train_set,
        {.batch_size = batch_size, .seed = seed, .num_shards = devices, .shard_index = replica});
    Loop loop{.config = &c,
              .ctx = &ctx,
              .composed = &composed,
              .optimizer = &opt,
              .state = &state,
              .total_steps = total_steps,
              .log_every = c.run.log_every,
              .model_parameters = model.num_params(),
              .batch = [&](std::int64_t) { return loader.next(); },
              .loader = &loader,
              // After every epoch unless run.eval_every says otherwise, and at the end.
              .eval_every = c.run.eval_every > 0 ? c.run.eval_every : steps_per_epoch};
    for (std::size_t i = replica; i < test_batches.size(); i += devices)
      loop.eval_batches.push_back(test_batches[i]);  // this replica's share of the test set
    const double epochs = static_cast<double>(total_steps) / static_cast<double>(steps_per_epoch);
    loop.summary = [&](const LoopResult& r) -> std::map<std::string, double> {
      return {{"test_accuracy", r.eval.mean("accuracy")},
              {"test_loss", r.eval.mean("loss")},
              {"epochs", epochs},
              {"batch_size", double(batch_size)},
              {"devices", double(devices)}};
    };
    const LoopResult r = run_loop(loop);
    if (ctx.device() == 0)
      std::printf("Final test accuracy: %.2f%% (loss %.4f) after %.4g epochs on %d devices\n",
                  100.0 * r.eval.mean("accuracy"), r.eval.mean("loss"), epochs, devices);
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {},
                  {.backend = c.distributed.comm_backend(), .device = c.distributed.placement()})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::app
