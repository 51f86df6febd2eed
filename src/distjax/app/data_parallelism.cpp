// Program data_parallelism: the original toolkit's data_parallelism example on real data,
// the MLP classifier on Fashion-MNIST over a ("data"=N) mesh with its parameters fully
// sharded (ZeRO-3 / FSDP), or plain data parallelism, ZeRO-1 or ZeRO-2 (parallelism.shard =
// "parameters", "none", "optimizer", "gradients"). Prints the mesh, the sharding of every
// parameter, "[FSDP] Step i: Loss = ..., Accuracy = ..." lines, the test accuracy and the
// bytes each device holds.
#include <cstdio>

#include "distjax/app/model_specs.hpp"
#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

using tensor::Tensor;

void check_data_parallelism(const config::TrainConfig& c) {
  DISTJAX_CHECK(c.parallelism.fsdp.modules.empty() ||
                    c.parallelism.fsdp.modules == std::vector<std::string>{"*"},
                ConfigError,
                "[data_parallelism] the classifier has no Block, Attn or MLP modules: "
                "parallelism.fsdp.modules must be [] or [\"*\"]");
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  DISTJAX_CHECK(mesh.ndim() == 1, ConfigError, "[data_parallelism] runs on a (\"data\") mesh, got ",
                mesh.describe());
}

int run_data_parallelism(const config::TrainConfig& c) {
  const int zero = config::zero_stage(c.parallelism.shard);
  const char* kTags[] = {"DP", "ZeRO-1", "ZeRO-2", "FSDP"};
  const char* tag = kTags[zero];
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data"});
  const int devices = mesh.size();
  if (c.distributed.is_main_process())
    std::printf("Mesh (%s backend, %s):\n%s\n", backend_label(c).c_str(), tag,
                mesh.to_string().c_str());

  const FashionMnist mnist = load_fashion_mnist(c);
  const data::ArrayDataset& train_set = mnist.train;
  const data::ArrayDataset& test_set = mnist.test;
  // One test batch per device: with fully sharded parameters every forward pass gathers,
  // so every device must run the same number of them (devices > 1 drop < devices images).
  const std::vector<train::Batch> all_test = test_set.batches(test_set.size() / devices);
  const models::Classifier model({.in_features = 784,
                                  .hidden = c.model.hidden,
                                  .num_classes = 10,
                                  .dropout = static_cast<float>(c.model.dropout)});
  const std::int64_t steps = c.run.steps;
  const optim::AdamW opt = make_adamw(c, steps);
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const Key root = Key::from_seed(seed);

  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    Composed composed(c, &ctx, classifier_spec(model));
    train::TrainState state = composed.create_state(opt, root.fold_in(std::string_view("init")),
                                                    root.fold_in(std::string_view("dropout")));
    if (lead)
      std::printf("%s", parallel::sharding_table(
                            parallel::global_shapes(model.init(root.fold_in(std::string_view("init")))),
                            composed.specs(), mesh)
                            .c_str());
    data::DataLoader loader(train_set, {.batch_size = c.run.batch_size,
                                        .seed = seed,
                                        .num_shards = devices,
                                        .shard_index = replica});
    const LoopResult r = run_loop(
        {.config = &c,
         .ctx = &ctx,
         .composed = &composed,
         .optimizer = &opt,
         .state = &state,
         .total_steps = steps,
         .log_every = 1 << 30,  // this program prints its own lines
         .model_parameters = model.num_params(),
         .print = false,
         .batch = [&](std::int64_t) { return loader.next(); },
         .loader = &loader,
         .eval_batches = {all_test[static_cast<std::size_t>(replica)]},
         .on_step = step_lines(tag, c, lead),
         .summary = [&](const LoopResult& r) -> std::map<std::string, double> {
           return {{"test_accuracy", r.eval.mean("accuracy")},
                   {"devices", double(devices)},
                   {"zero_stage", double(zero)}};
         }});
    if (lead) {
      std::printf("[%s] Test accuracy: %.2f%% (%lld images) after %lld steps on %d devices\n", tag,
                  100.0 * r.eval.mean("accuracy"), static_cast<long long>(r.eval.at("accuracy").count),
                  static_cast<long long>(steps), devices);
      std::printf(
          "[%s] Bytes held by device 0: parameters %lld, optimizer state %lld "
          "(the model has %lld parameters: %lld bytes each replicated)\n",
          tag, static_cast<long long>(state.params.storage_bytes()),
          static_cast<long long>(state.opt_state.storage_bytes()),
          static_cast<long long>(model.num_params()),
          static_cast<long long>(4 * model.num_params()));
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {},
                  {.backend = c.distributed.comm_backend(), .device = c.distributed.placement()})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::app
