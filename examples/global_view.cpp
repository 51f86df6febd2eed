// global_view: the guide's "complete training loop" in DistJax's global view. A (2, 4)
// mesh ("data" x "model"), parameters placed by sharding rules on their paths, and a
// training step written as for one device: the propagation rules insert the
// communication (printed once as the step's plan). Trains the MLP classifier on
// Fashion-MNIST (synthetic data when the files are absent) and the GPT on the fortunes
// corpus. The same binary runs on simulated devices and under MPI:
//
//   ./global_view                                  # 8 simulated devices (threads)
//   mpirun -np 8 --oversubscribe ./global_view     # 8 processes (MPI is auto-detected)
//   ./global_view --steps 50 --gpt-steps 30 --backend threads|mpi
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/global/comm_plan.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/nn_ops.hpp"
#include "distjax/global/program.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/global_transformer.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/schedule.hpp"
#include "distjax/parallel/sharding_rules.hpp"

using namespace distjax;
using global::GlobalArray;
using global::GlobalSharding;
using global::GlobalTree;
using mesh::P;
using tensor::Tensor;

namespace {

struct Options {
  int steps = 40, gpt_steps = 20;
  comm::Backend backend = comm::Backend::Threads;
  bool leader = true;  // the process that prints the tables (rank 0 under MPI)
};

// The MLP, written for one device.
GlobalArray mlp_loss(const GlobalTree& p, const GlobalArray& x, const GlobalArray& y) {
  GlobalArray h =
      global::silu(global::add(global::matmul(x, p.at("fc1/kernel")), p.at("fc1/bias")));
  GlobalArray logits = global::add(global::matmul(h, p.at("fc2/kernel")), p.at("fc2/bias"));
  return global::mean(global::cross_entropy(logits, y));
}

// One program for both models: `loss(params, step) -> scalar` on GlobalArrays; Adam on
// each device's blocks (every gradient has its parameter's sharding).
void train_program(const char* title, const mesh::Mesh& mesh, const tensor::TensorTree& init,
                   const parallel::ShardingRules& rules, int steps, const Options& opt,
                   const std::function<GlobalArray(const GlobalTree&, int)>& loss_fn) {
  if (opt.leader)
    std::printf(
        "\n== %s\n%s", title,
        parallel::sharding_table(parallel::global_shapes(init), rules.specs_for(init, mesh), mesh)
            .c_str());
  const optim::Adam adam({.learning_rate = optim::constant_schedule(2e-3)});
  spmd::ShardMapOptions so;
  so.backend = opt.backend;
  so.timeout = std::chrono::milliseconds(120000);
  auto run = spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        GlobalTree params;  // shard_param: each device cuts its block of the init by the rules
        for (const auto& [path, t] : init)
          params.emplace(path,
                         GlobalArray::from_host(ctx, t, GlobalSharding{rules.spec_for(path)}));
        tensor::TensorTree locals = global::locals_of(params), state = adam.init(locals);
        for (int s = 0; s < steps; ++s) {
          global::PlanRecorder plan;
          auto [loss, grads] = [&] {
            global::RecordPlan on(plan);
            return global::value_and_grad([&](const GlobalTree& p) { return loss_fn(p, s); },
                                          params);
          }();
          adam.update(locals, global::locals_of(grads), state, s);
          if (ctx.device() == 0 && s == 0)
            std::printf("plan of one step (device 0):\n%s", plan.str().c_str());
          if (ctx.device() == 0 && (s % 10 == 0 || s == steps - 1))
            std::printf("step %3d  loss %.4f\n", s, loss.local().item<double>());
        }
        return std::vector<Tensor>{};
      },
      {}, {}, so);
  run(std::vector<Tensor>{});
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  const comm::LaunchEnvironment env = comm::discover_launch_environment();
  opt.backend = comm::default_backend(env);
  opt.leader = env.rank == 0;
  std::string backend;
  CLI::App cli{"global_view: the MLP and the GPT trained in the global view on a (2, 4) mesh"};
  cli.add_option("--steps", opt.steps, "steps of the MLP");
  cli.add_option("--gpt-steps", opt.gpt_steps, "steps of the GPT");
  cli.add_option("--backend", backend, "threads or mpi (default: mpi under a launcher)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  CLI11_PARSE(cli, argc, argv);
  if (!backend.empty()) opt.backend = backend == "mpi" ? comm::Backend::Mpi : comm::Backend::Threads;
  try {
    const mesh::Mesh mesh({2, 4}, {"data", "model"});
    // ---- MLP on Fashion-MNIST: fc1 split by columns, fc2 by rows, batch over data.
    const bool real = data::fashion_mnist_available();
    const data::ArrayDataset ds =
        real ? data::load_fashion_mnist(data::Split::Train)
             : data::synthetic_classification(4096, 784, 10, Key::from_seed(0));
    const models::Classifier clf(
        {.in_features = 784, .hidden = 512, .num_classes = 10, .dropout = 0.f});
    const parallel::ShardingRules mlp_rules({{"fc1/kernel$", P(std::nullopt, "model")},
                                             {"fc1/bias$", P("model")},
                                             {"fc2/kernel$", P("model", std::nullopt)}});
    constexpr std::int64_t kBatch = 128;
    train_program(real ? "MLP on Fashion-MNIST" : "MLP on synthetic data (Fashion-MNIST not found)",
                  mesh, clf.init(Key::from_seed(1)), mlp_rules, opt.steps, opt,
                  [&](const GlobalTree& p, int s) {
                    const std::int64_t b0 = (s * kBatch) % (ds.size() - kBatch);
                    const train::Batch b = ds.slice(b0, b0 + kBatch);
                    spmd::DeviceContext& ctx = p.begin()->second.ctx();
                    return mlp_loss(p, GlobalArray::from_host(ctx, b.inputs, {P("data")}),
                                    GlobalArray::from_host(ctx, b.labels, {P("data")}));
                  });
    // ---- GPT on the fortunes corpus: Megatron rules by path, batch over data.
    const data::ByteCorpus corpus = data::load_fortunes();
    const models::TransformerConfig gcfg{
        .vocab = 256, .d_model = 128, .num_layers = 2, .num_heads = 4, .max_len = 64};
    train_program(
        "GPT on the fortunes corpus", mesh, models::Transformer(gcfg).init(Key::from_seed(2)),
        models::transformer_megatron_rules("model"), opt.gpt_steps, opt,
        [&](const GlobalTree& p, int s) {
          const train::Batch b = data::sample_windows(
              corpus.train, 16, 64, Key::from_seed(3).fold_in(static_cast<std::uint64_t>(s)));
          spmd::DeviceContext& ctx = p.begin()->second.ctx();
          return models::global_transformer_loss(
              gcfg, p, GlobalArray::from_host(ctx, b.inputs, {P("data")}),
              GlobalArray::from_host(ctx, b.labels, {P("data")}));
        });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "global_view: %s\n", e.what());
    return 1;
  }
  return 0;
}
