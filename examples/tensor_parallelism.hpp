// The program of the tensor_parallelism and tensor_parallelism_async examples: the
// toolkit's TP classifier on Fashion-MNIST over a ("data", "model") mesh (2 x 4 by
// default): data parallel over "data", tensor parallel over "model", with synchronous
// all-gathers / reduce-scatters or asynchronous ppermute rings.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/tp_classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"
#include "example_common.hpp"

namespace distjax::examples {

inline int run_tensor_parallelism(int argc, char** argv, const char* program, bool async_rings) {
  using tensor::Tensor;
  using tensor::TensorTree;
  Args args(program, async_rings ? "the TP classifier on Fashion-MNIST with async TP rings"
                                 : "the TP classifier on Fashion-MNIST (data x model mesh)");
  long long& n_data = args.flag("data", 2LL, "devices along \"data\"");
  long long& n_model = args.flag("model", 4LL, "devices along \"model\" (tensor parallel)");
  long long& steps = args.flag("steps", 300LL, "optimizer steps");
  long long& batch_size = args.flag("batch-size", 128LL, "global batch (split over \"data\")");
  long long& hidden = args.flag("hidden", 512LL, "hidden width (divisible by --model)");
  long long& layers = args.flag("layers", 3LL, "TP MLP blocks");
  double& dropout = args.flag("dropout", 0.1, "dropout rate in the blocks");
  long long& bidirectional = args.flag("bidirectional", 0LL, "async: 1 = rings both ways");
  long long& log_every = args.flag("log-every", 50LL, "steps between progress lines");
  std::string& out = args.flag("out", std::string("runs/") + program, "output directory");
  std::string& data_dir = args.flag("data-dir", std::string(data::kFashionMnistDir),
                                    "directory of the Fashion-MNIST IDX files");
  std::string& backend_name =
      args.flag("backend", default_backend(),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  comm::Backend backend;
  if (!parse_backend(program, backend_name, &backend)) return 2;
  if (const long long np = mpi_world_size();
      backend == comm::Backend::Mpi && np > 0 && np != n_data * n_model) {
    std::fprintf(stderr, "%s: mpirun -np %lld does not match --data %lld x --model %lld\n", program,
                 np, n_data, n_model);
    return 2;
  }
  if (n_data < 1 || n_model < 1 || batch_size % n_data != 0 || hidden % n_model != 0) {
    std::fprintf(stderr,
                 "%s: --batch-size %lld must be divisible by --data %lld, and --hidden %lld by "
                 "--model %lld\n",
                 program, batch_size, n_data, hidden, n_model);
    return 2;
  }
  const mesh::Mesh mesh({static_cast<int>(n_data), static_cast<int>(n_model)}, {"data", "model"});
  if (main_process())
    std::printf("Mesh (%s backend, %s tensor parallelism):\n%s\n", backend_name.c_str(),
                async_rings ? (bidirectional ? "async bidirectional" : "async") : "synchronous",
                mesh.to_string().c_str());

  const data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  const data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  // One test batch per data replica (every device of a replica runs the same passes).
  const std::vector<train::Batch> test_batches = test_set.batches(test_set.size() / n_data);
  const models::TPClassifier model({.in_features = 784,
                                    .hidden = hidden,
                                    .num_classes = 10,
                                    .num_layers = static_cast<int>(layers),
                                    .mlp_expansion = 1,
                                    .dropout = static_cast<float>(dropout),
                                    .async_rings = async_rings,
                                    .bidirectional = bidirectional != 0});
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(
                        0.0, 1e-3, std::min<long long>(20, steps - 1), steps, 1e-5),
                    .decay_mask = optim::default_decay_mask()});
  const Key root = Key::from_seed(42);  // the toolkit's seed

  auto device_program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const bool lead = ctx.device() == 0;
    const int replica = ctx.axis_index("data");
    nn::ParamSpecs specs;
    TensorTree params = model.init(root.fold_in(std::string_view("init")), &specs, &ctx);
    parallel::DataParallel dp(ctx, "data", &specs);
    train::TrainState state =
        train::TrainState::create(params, opt, root.fold_in(std::string_view("dropout")), dp);
    if (lead)
      std::printf("TP classifier 784-%lld x%lld-10: %lld parameters, %lld on each device\n", hidden,
                  layers, static_cast<long long>(model.num_params()),
                  static_cast<long long>(state.params.num_elements()));
    auto loss_fn = [&](bool train) -> train::LossFn {
      return [&, train](const TensorTree& p, const train::Batch& b, Key k) {
        return classification_loss(model(nn::Scope::apply(&p, train, k).on(ctx), b.inputs),
                                   b.labels);
      };
    };
    data::DataLoader loader(train_set, {.batch_size = batch_size,
                                        .seed = 42,
                                        .num_shards = static_cast<int>(n_data),
                                        .shard_index = replica});
    train::Trainer trainer({.out_dir = lead ? out : std::string(),
                            .total_steps = steps,
                            .log_every = 1 << 30,  // this example prints its own lines
                            .mesh = mesh.describe(),
                            .backend = backend_name,
                            .print = false},
                           opt, loss_fn(true), {.max_grad_norm = 1.0, .strategy = &dp});
    const auto t0 = std::chrono::steady_clock::now();
    for (long long s = 1; s <= steps; ++s) {
      const train::Metrics m = trainer.step(state, loader.next());
      if (lead && (s % log_every == 0 || s == 1 || s == steps))
        std::printf("[TP] Step %lld: Loss = %.4f, Accuracy = %.4f\n", s, m.mean("loss"),
                    m.mean("accuracy"));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const train::Metrics eval = trainer.evaluate(state, {test_batches[replica]}, loss_fn(false));
    trainer.finish(state, {{"test_accuracy", eval.mean("accuracy")},
                           {"step_time_s", seconds / static_cast<double>(steps)}});
    if (lead)
      std::printf("[TP] Test accuracy: %.2f%% (%lld images) after %lld steps, %.1f ms per step\n",
                  100.0 * eval.mean("accuracy"), static_cast<long long>(eval.at("accuracy").count),
                  steps, 1e3 * seconds / static_cast<double>(steps));
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, device_program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::examples
