// The MLP classifier (Dense -> relu -> Dense -> cross-entropy) written once in the global
// view and trained 5 SGD steps under data parallelism, column/row tensor parallelism and
// both (data x model), against the same program on one device; and the plan of the
// Megatron MLP block: one all-reduce over "model" forward and one backward.
#include <gtest/gtest.h>

#include "distjax/comm/comm_stats.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/nn_ops.hpp"
#include "distjax/global/program.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "global/global_test_util.hpp"

namespace distjax::global {
namespace {

constexpr auto None = std::nullopt;
constexpr std::int64_t kBatch = 16, kIn = 16, kHidden = 32, kClasses = 8;
constexpr int kSteps = 5;
constexpr double kLr = 0.5;

// The program, global view: the same code for every sharding.
GlobalArray mlp_loss(const GlobalTree& p, const GlobalArray& x, const GlobalArray& y) {
  GlobalArray h = relu(add(matmul(x, p.at("fc1/kernel")), p.at("fc1/bias")));
  GlobalArray logits = add(matmul(h, p.at("fc2/kernel")), p.at("fc2/bias"));
  return mean(cross_entropy(logits, y));
}

// The same on one device, plain tensors.
Tensor mlp_loss_ref(const tensor::TensorTree& p, const Tensor& x, const Tensor& y) {
  Tensor h = tensor::relu(tensor::add(tensor::matmul(x, p.at("fc1/kernel")), p.at("fc1/bias")));
  Tensor logits = tensor::add(tensor::matmul(h, p.at("fc2/kernel")), p.at("fc2/bias"));
  return tensor::mean(tensor::cross_entropy(logits, y));
}

tensor::TensorTree init_params() {
  tensor::TensorTree p;
  p.set("fc1/kernel", testing::randn({kIn, kHidden}, 11, 0.3));
  p.set("fc1/bias", testing::randn({kHidden}, 12, 0.1));
  p.set("fc2/kernel", testing::randn({kHidden, kClasses}, 13, 0.3));
  p.set("fc2/bias", testing::randn({kClasses}, 14, 0.1));
  return p;
}

struct Batch {
  Tensor x, y;
};

std::vector<Batch> batches() {
  std::vector<Batch> out;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::int32_t> y(kBatch);
    for (std::int64_t i = 0; i < kBatch; ++i)
      y[i] = static_cast<std::int32_t>((i * 7 + s * 3) % kClasses);
    out.push_back({testing::randn({kBatch, kIn}, 100 + static_cast<std::uint64_t>(s)),
                   Tensor::from_vector(y, {kBatch})});
  }
  return out;
}

struct TrainRun {
  std::vector<double> losses;
  tensor::TensorTree params;
};

TrainRun train_reference() {
  TrainRun run;
  run.params = init_params();
  for (const auto& b : batches()) {
    auto [loss, g] = autodiff::value_and_grad(
        [&](const tensor::TensorTree& p) { return mlp_loss_ref(p, b.x, b.y); })(run.params);
    run.losses.push_back(loss.item<double>());
    for (const auto& path : run.params.paths())
      run.params.set(path, tensor::sub(run.params.at(path), tensor::mul_scalar(g.at(path), kLr)));
  }
  return run;
}

struct Layout {
  std::string name;
  Mesh mesh;
  std::vector<parallel::ShardingRule> rules;
  GlobalSharding batch;  // of x's rows and y
};

TrainRun train_global(const Layout& l) {
  const parallel::ShardingRules rules(l.rules);
  TrainRun run;
  std::mutex mu;
  const auto data = batches();
  const tensor::TensorTree init = init_params();
  testing::run_devices(l.mesh, [&](spmd::DeviceContext& ctx) {
    GlobalTree params;
    for (const auto& [path, t] : init)
      params.emplace(path, testing::place(ctx, t, GlobalSharding{rules.spec_for(path)}));
    std::vector<double> losses;
    for (const auto& b : data) {
      const GlobalArray x = testing::place(ctx, b.x, GlobalSharding{l.batch.spec});
      const GlobalArray y = testing::place(ctx, b.y, l.batch);
      auto [loss, grads] =
          value_and_grad([&](const GlobalTree& p) { return mlp_loss(p, x, y); }, params);
      losses.push_back(loss.local().item<double>());
      for (auto& [path, p] : params) {
        // Every gradient has its parameter's sharding: the update is local.
        EXPECT_EQ(grads.at(path).sharding(), p.sharding()) << path;
        p = GlobalArray(ctx,
                        tensor::sub(p.local(), tensor::mul_scalar(grads.at(path).local(), kLr)),
                        p.shape(), p.sharding());
      }
    }
    tensor::TensorTree whole;
    for (const auto& [path, p] : params)
      whole.set(path, testing::to_host(p));
    std::lock_guard<std::mutex> lock(mu);
    if (ctx.device() == 0) run = {losses, whole};
  });
  return run;
}

std::vector<Layout> layouts() {
  const std::vector<parallel::ShardingRule> tp{{"fc1/kernel$", P(None, "model")},
                                               {"fc1/bias$", P("model")},
                                               {"fc2/kernel$", P("model", None)}};
  return {
      {"data parallel", Mesh({4}, {"data"}), {}, {P("data")}},
      {"column/row tensor parallel", Mesh({4}, {"model"}), tp, {P()}},
      {"2-D data x model", Mesh({2, 4}, {"data", "model"}), tp, {P("data")}},
      {"weights split over data (FSDP-like)",
       Mesh({2, 2}, {"data", "model"}),
       {{"fc1/kernel$", P("data", "model")}, {"fc2/kernel$", P("model", "data")}},
       {P("data")}},
  };
}

TEST(GlobalMlp, ParityWithOneDevice) {
  const TrainRun ref = train_reference();
  for (const auto& l : layouts()) {
    const TrainRun got = train_global(l);
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << l.name;
    for (std::size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s]))
          << l.name << " step " << s;
    for (const auto& path : ref.params.paths())
      EXPECT_LE(testing::rel_diff(got.params.at(path), ref.params.at(path)), 1e-5)
          << l.name << " " << path;
  }
  // The losses really change: 5 steps of a working optimiser.
  EXPECT_LT(ref.losses.back(), ref.losses.front());
}

// The Megatron block: fc1 split by columns, fc2 by rows, after a replicated Dense whose
// output needs a gradient (as inside a deep network). Per step over "model": one
// all-reduce forward (the partial logits, where the loss consumes them) and one backward
// (the block input's cotangent), in the plan and in the communicator's counters.
TEST(GlobalMlp, MegatronBlockPlanIsOneAllReduceEachWay) {
  const Mesh mesh({2, 4}, {"data", "model"});
  const parallel::ShardingRules rules({{"fc1/kernel$", P(None, "model")},
                                       {"fc1/bias$", P("model")},
                                       {"fc2/kernel$", P("model", None)}});
  const tensor::TensorTree init = [] {
    tensor::TensorTree p = init_params();
    p.set("in/kernel", testing::randn({kIn, kIn}, 15, 0.3));
    return p;
  }();
  const auto b = batches()[0];
  std::vector<std::string> failures(static_cast<std::size_t>(mesh.size()));
  std::string printed;
  testing::run_devices(mesh, [&](spmd::DeviceContext& ctx) {
    GlobalTree params;
    for (const auto& [path, t] : init)
      params.emplace(path, testing::place(ctx, t, GlobalSharding{rules.spec_for(path)}));
    const GlobalArray x = testing::place(ctx, b.x, GlobalSharding{P("data")});
    const GlobalArray y = testing::place(ctx, b.y, GlobalSharding{P("data")});
    ctx.comm_stats().reset();
    PlanRecorder plan;
    {
      RecordPlan on(plan);
      value_and_grad(
          [&](const GlobalTree& p) { return mlp_loss(p, matmul(x, p.at("in/kernel")), y); },
          params);
    }
    using Ph = PlanEntry::Phase;
    const auto& stats = ctx.comm_stats();
    std::string why;
    if (plan.count("all_reduce", "model", Ph::Forward) != 1) why += " plan forward";
    // The replicated Dense (2 x 8 x 16 x 16 FLOPs on each of the 4 devices along "model")
    // is repeated; fc1 (2 x 8 x 8 x 16) and fc2 (2 x 8 x 8 x 8) are split (docs/global-view.md).
    if (plan.flops() != 7168 || plan.repeated_fraction("model") != 4096.0 / 7168)
      why += " redundant compute " + std::to_string(plan.flops());
    if (plan.str().find("redundant compute: the devices along \"model\" repeat 57.1% of the "
                        "forward FLOPs (4096 of 7168)") == std::string::npos)
      why += " report";
    if (plan.count("all_reduce", "model", Ph::Backward) != 1) why += " plan backward";
    for (const char* c : {"all_gather", "reduce_scatter", "all_to_all"})
      if (plan.count(c, "model", Ph::Forward) + plan.count(c, "model", Ph::Backward) != 0)
        why += std::string(" plan ") + c;
    if (stats.of("model", comm::OpKind::AllReduce).calls != 2)
      why += " counters: model all-reduce calls " +
             std::to_string(stats.of("model", comm::OpKind::AllReduce).calls);
    const std::int64_t planned = plan.bytes("all_reduce", "model", Ph::Forward) +
                                 plan.bytes("all_reduce", "model", Ph::Backward);
    if (stats.of("model", comm::OpKind::AllReduce).bytes_sent != planned) why += " counters: bytes";
    for (auto k : {comm::OpKind::AllGather, comm::OpKind::ReduceScatter, comm::OpKind::AllToAll})
      if (stats.of("model", k).calls != 0) why += " counters: other kinds over model";
    failures[static_cast<std::size_t>(ctx.device())] = why;
    if (ctx.device() == 0) printed = plan.str();
  });
  for (const auto& f : failures)
    EXPECT_EQ(f, "") << printed;
  std::cout << printed;
}

// The plan reports redundant compute: with every weight replicated and only the batch
// split over "data", the two devices along "model" compute the same matmuls (all of the
// forward FLOPs repeated); with the Megatron layout nothing is repeated along "model".
TEST(GlobalMlp, PlanReportsComputeRepeatedAlongAnAxis) {
  const Mesh mesh({2, 2}, {"data", "model"});
  const parallel::ShardingRules megatron({{"fc1/kernel$", P(None, "model")},
                                          {"fc1/bias$", P("model")},
                                          {"fc2/kernel$", P("model", None)}});
  const auto b = batches()[0];
  for (const bool tp : {false, true}) {
    std::vector<double> model_share(static_cast<std::size_t>(mesh.size()), -1.0),
        data_share(static_cast<std::size_t>(mesh.size()), -1.0);
    std::vector<std::string> report(static_cast<std::size_t>(mesh.size()));
    testing::run_devices(mesh, [&](spmd::DeviceContext& ctx) {
      GlobalTree params;
      for (const auto& [path, t] : init_params())
        params.emplace(path,
                       testing::place(ctx, t, GlobalSharding{tp ? megatron.spec_for(path) : P()}));
      const GlobalArray x = testing::place(ctx, b.x, GlobalSharding{P("data")});
      const GlobalArray y = testing::place(ctx, b.y, GlobalSharding{P("data")});
      PlanRecorder plan;
      {
        RecordPlan on(plan);
        value_and_grad([&](const GlobalTree& p) { return mlp_loss(p, x, y); }, params);
      }
      const auto d = static_cast<std::size_t>(ctx.device());
      model_share[d] = plan.flops() > 0 ? plan.repeated_fraction("model") : -1.0;
      data_share[d] = plan.repeated_fraction("data");
      report[d] = plan.str();
    });
    for (std::size_t d = 0; d < model_share.size(); ++d) {
      EXPECT_EQ(model_share[d], tp ? 0.0 : 1.0) << (tp ? "megatron" : "replicated") << "\n"
                                                << report[d];
      EXPECT_EQ(data_share[d], 0.0) << report[d];
      EXPECT_EQ(report[d].find("redundant compute: the devices along \"model\" repeat 100.0%") !=
                    std::string::npos,
                !tp)
          << report[d];
    }
  }
}

}  // namespace
}  // namespace distjax::global
