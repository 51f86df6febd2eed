// Program tensor_parallelism: the toolkit's TP classifier on Fashion-MNIST over a ("data",
// "model") mesh (2 x 4 in its configs): data parallel over "data", tensor parallel over
// "model", with synchronous all-gathers / reduce-scatters (parallelism.tp_layout =
// "gather") or asynchronous ppermute rings ("async", optionally bidirectional).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "distjax/app/model_specs.hpp"
#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/models/tp_classifier.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

using tensor::Tensor;

void check_tensor_parallelism(const config::TrainConfig& c) {
  const std::string& layout = c.parallelism.tp_layout;
  DISTJAX_CHECK(layout == "gather" || layout == "async", ConfigError,
                "[tensor_parallelism] parallelism.tp_layout must be \"gather\" (synchronous) or "
                "\"async\" (ppermute rings) for the TP classifier, got \"",
                layout, "\"");
  const int n_model = config::build_mesh(c.distributed, {"data", "model"}).axis_size("model");
  DISTJAX_CHECK(c.model.hidden % n_model == 0, ConfigError,
                "[tensor_parallelism] model.hidden = ", c.model.hidden,
                " must be divisible by the \"model\" axis size ", n_model);
}

int run_tensor_parallelism(const config::TrainConfig& c) {
  const std::string& layout = c.parallelism.tp_layout;
  const bool async_rings = layout == "async";
  const bool bidirectional = c.parallelism.bidirectional;
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  const int n_data = mesh.axis_size("data");
  if (c.distributed.is_main_process())
    std::printf("Mesh (%s backend, %s tensor parallelism):\n%s\n", backend_label(c).c_str(),
                async_rings ? (bidirectional ? "async bidirectional" : "async") : "synchronous",
                mesh.to_string().c_str());

  const FashionMnist mnist = load_fashion_mnist(c);
  const data::ArrayDataset& train_set = mnist.train;
  const data::ArrayDataset& test_set = mnist.test;
  // One test batch per data replica (every device of a replica runs the same passes).
  const std::vector<train::Batch> test_batches = test_set.batches(test_set.size() / n_data);
  const models::TPClassifier model({.in_features = 784,
                                    .hidden = c.model.hidden,
                                    .num_classes = 10,
                                    .num_layers = static_cast<int>(c.model.layers),
                                    .mlp_expansion = 1,
                                    .dropout = static_cast<float>(c.model.dropout),
                                    .async_rings = async_rings,
                                    .bidirectional = bidirectional});
  const std::int64_t steps = c.run.steps;
  const optim::AdamW opt = make_adamw(c, steps);
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const Key root = Key::from_seed(seed);

  const ModelSpec spec{
      .init = [&](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                  const nn::FullySharded*) { return model.init(key, specs, ctx); },
      .loss = [&](const nn::Scope& scope, const train::Batch& b) {
        return models::classification_loss(model(scope, b.inputs), b.labels);
      }};

  auto device_program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const bool lead = ctx.device() == 0;
    const int replica = ctx.axis_index("data");
    Composed composed(c, &ctx, spec);
    train::TrainState state = composed.create_state(opt, root.fold_in(std::string_view("init")),
                                                    root.fold_in(std::string_view("dropout")));
    if (lead)
      std::printf("TP classifier 784-%lld x%lld-10: %lld parameters, %lld on each device\n",
                  static_cast<long long>(c.model.hidden), static_cast<long long>(c.model.layers),
                  static_cast<long long>(model.num_params()),
                  static_cast<long long>(state.params.num_elements()));
    data::DataLoader loader(train_set, {.batch_size = c.run.batch_size,
                                        .seed = seed,
                                        .num_shards = n_data,
                                        .shard_index = replica});
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t first = state.step;
    double ms_per_step = 0.0;
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
         .eval_batches = {test_batches[static_cast<std::size_t>(replica)]},
         .on_step = step_lines("TP", c, lead),
         .after_training = [&]() -> std::map<std::string, double> {
           const double seconds =
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
           ms_per_step = 1e3 * seconds / static_cast<double>(std::max<std::int64_t>(1, steps - first));
           return {{"step_time_s", ms_per_step / 1e3}};
         },
         .summary = [&](const LoopResult& r) -> std::map<std::string, double> {
           return {{"test_accuracy", r.eval.mean("accuracy")}};
         }});
    if (lead) {
      std::printf("[TP] Test accuracy: %.2f%% (%lld images) after %lld steps",
                  100.0 * r.eval.mean("accuracy"), static_cast<long long>(r.eval.at("accuracy").count),
                  static_cast<long long>(steps));
      if (!r.already_finished) std::printf(", %.1f ms per step", ms_per_step);
      std::printf("\n");
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, device_program, {}, {},
                  {.backend = c.distributed.comm_backend(), .device = c.distributed.placement()})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::app
