// The original toolkit's data_parallelism example, on real data: the MLP classifier on
// Fashion-MNIST over a ("data"=8) mesh of simulated devices, with its parameters fully
// sharded (ZeRO-3 / FSDP) by default, or plain data parallelism, ZeRO-1 or ZeRO-2.
// Prints the mesh, the sharding of every parameter, "[FSDP] Step i: Loss = ..., Accuracy
// = ..." lines, the test accuracy and the bytes each device holds.
//
//   ./build/data_parallelism [--devices 8 --zero 3 --steps 300 --min-weight-size 262144]
//   mpirun -np 8 ./build/data_parallelism          (one process per device)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/parallel/zero.hpp"
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

const char* kTags[] = {"DP", "ZeRO-1", "ZeRO-2", "FSDP"};

int run(int argc, char** argv) {
  examples::Args args("data_parallelism",
                      "the MLP classifier on Fashion-MNIST, data parallel with ZeRO / FSDP");
  long long& devices = args.flag("devices", 8LL, "devices along \"data\" (threads or MPI ranks)");
  long long& zero = args.flag("zero", 3LL, "0 plain data parallelism, 1 or 2 ZeRO, 3 FSDP");
  long long& steps = args.flag("steps", 300LL, "optimizer steps");
  long long& batch_size = args.flag("batch-size", 128LL, "global batch (split over devices)");
  long long& min_weight = args.flag("min-weight-size", 1LL << 18,
                                    "FSDP: parameters with fewer elements stay replicated");
  long long& log_every = args.flag("log-every", 50LL, "steps between progress lines");
  std::string& out = args.flag("out", std::string("runs/data_parallelism"), "output directory");
  std::string& data_dir = args.flag("data", std::string(data::kFashionMnistDir),
                                    "directory of the Fashion-MNIST IDX files");
  std::string& backend_name =
      args.flag("backend", examples::default_backend(),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  comm::Backend backend;
  if (!examples::parse_backend("data_parallelism", backend_name, &backend)) return 2;
  if (backend == comm::Backend::Mpi && examples::mpi_world_size() > 0)
    devices = examples::mpi_world_size();
  if (zero < 0 || zero > 3) {
    std::fprintf(stderr, "data_parallelism: --zero must be 0, 1, 2 or 3, got %lld\n", zero);
    return 2;
  }
  if (devices < 1 || batch_size % devices != 0) {
    std::fprintf(stderr,
                 "data_parallelism: --batch-size %lld must be divisible by --devices %lld\n",
                 batch_size, devices);
    return 2;
  }
  const char* tag = kTags[zero];
  const mesh::Mesh mesh({static_cast<int>(devices)}, {"data"});
  if (examples::main_process())
    std::printf("Mesh (%s backend, %s):\n%s\n", backend_name.c_str(), tag,
                mesh.to_string().c_str());

  const data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  const data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  // One test batch per device: with fully sharded parameters every forward pass gathers,
  // so every device must run the same number of them (devices > 1 drop < devices images).
  const std::vector<train::Batch> all_test = test_set.batches(test_set.size() / devices);
  const models::Classifier model({.in_features = 784, .hidden = 512, .num_classes = 10});
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(
                        0.0, 1e-3, std::min<long long>(20, steps - 1), steps, 1e-5),
                    .decay_mask = optim::default_decay_mask()});
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = min_weight};
  const bool sharded = zero == 3;
  const Key root = Key::from_seed(69);  // the toolkit's seed

  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    nn::ParamSpecs specs;
    TensorTree params =
        model.init(root.fold_in(std::string_view("init")), &specs, &ctx, sharded ? &fsdp : nullptr);
    std::unique_ptr<parallel::Strategy> strategy;
    if (zero == 1 || zero == 2) {
      strategy =
          std::make_unique<parallel::ZeroDataParallel>(ctx, static_cast<int>(zero), "data", &specs);
    } else {
      strategy = std::make_unique<parallel::DataParallel>(ctx, "data", &specs);
    }
    train::TrainState state = train::TrainState::create(
        params, opt, root.fold_in(std::string_view("dropout")), *strategy);
    // The guide's pitfalls (a weight split over "data" without FSDP, idle axes) rejected.
    parallel::check_sharding(
        specs, mesh,
        {.data_axes = "data", .fully_sharded_axes = sharded ? mesh::Axes("data") : mesh::Axes()});
    if (lead)
      std::printf("%s",
                  parallel::sharding_table(
                      parallel::global_shapes(model.init(root.fold_in(std::string_view("init")))),
                      specs, mesh)
                      .c_str());
    auto loss_fn = [&](bool train) -> train::LossFn {
      return [&, train](const TensorTree& p, const train::Batch& b, Key k) {
        nn::Scope s = nn::Scope::apply(&p, train, k).on(ctx);
        if (sharded) s = s.fully_sharded(fsdp);
        return examples::classification_loss(model(s, b.inputs), b.labels);
      };
    };
    data::DataLoader loader(train_set, {.batch_size = batch_size,
                                        .seed = 69,
                                        .num_shards = static_cast<int>(devices),
                                        .shard_index = replica});
    train::Trainer trainer({.out_dir = lead ? out : std::string(),
                            .total_steps = steps,
                            .log_every = 1 << 30,  // this example prints its own lines
                            .mesh = "data=" + std::to_string(devices),
                            .backend = backend_name,
                            .print = false},
                           opt, loss_fn(true), {.max_grad_norm = 1.0, .strategy = strategy.get()});
    for (long long s = 1; s <= steps; ++s) {
      const train::Metrics m = trainer.step(state, loader.next());
      if (lead && (s % log_every == 0 || s == 1 || s == steps))
        std::printf("[%s] Step %lld: Loss = %.4f, Accuracy = %.4f\n", tag, s, m.mean("loss"),
                    m.mean("accuracy"));
    }
    const train::Metrics eval = trainer.evaluate(state, {all_test[replica]}, loss_fn(false));
    trainer.finish(state, {{"test_accuracy", eval.mean("accuracy")},
                           {"devices", double(devices)},
                           {"zero_stage", double(zero)}});
    if (lead) {
      std::printf("[%s] Test accuracy: %.2f%% (%lld images) after %lld steps on %lld devices\n",
                  tag, 100.0 * eval.mean("accuracy"),
                  static_cast<long long>(eval.at("accuracy").count), steps, devices);
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
  spmd::shard_map(mesh, program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::examples::run_main("data_parallelism", [&] { return run(argc, argv); });
}
