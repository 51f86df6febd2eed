// reshard between shardings: the planned steps (pure), and on a ("data"=2, "model"=4)
// mesh the values, the gradients, and the bytes against the communicator's counters.
#include "distjax/global/redistribute.hpp"

#include <gtest/gtest.h>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/program.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/tensor/matmul.hpp"
#include "global/global_test_util.hpp"

namespace distjax::global {
namespace {

using testing::join;

const Mesh kMesh({2, 4}, {"data", "model"});

std::string steps_of(const Shape& shape, const GlobalSharding& from, const GlobalSharding& to) {
  std::vector<std::string> out;
  for (const auto& s : plan_redistribution(shape, from, to, kMesh)) {
    std::string axes;
    for (const auto& a : s.axes)
      axes += (axes.empty() ? "" : ",") + a;
    out.push_back(std::string(step_name(s.kind)) + "@" + axes);
  }
  return join(out);
}

struct ReshardCase {
  GlobalSharding from, to;
  std::string steps;
};

std::vector<ReshardCase> reshard_cases() {
  return {
      {{P("data", std::nullopt)}, {P()}, "all_gather@data"},
      {{P(std::nullopt, "model")}, {P("model", std::nullopt)}, "all_to_all@model"},
      {{P(), {"model"}}, {P()}, "all_reduce@model"},
      {{P(), {"model"}}, {P("model")}, "reduce_scatter@model"},
      {{P(), {"data", "model"}},
       {P(std::nullopt, "model")},
       "all_reduce@data reduce_scatter@model"},
      {{P()}, {P("data", "model")}, "split@data split@model"},
      {{P({"data", "model"})}, {P("data")}, "all_gather@model"},
      {{P({"data", "model"})}, {P()}, "all_gather@data,model"},
      {{P("data", "model")}, {P("model", "data")}, "all_gather@data all_to_all@model split@data"},
      {{P("data"), {"model"}}, {P()}, "all_reduce@model all_gather@data"},
      {{P()}, {P(), {"model"}}, "to_partial@model"},
      {{P("data", "model")}, {P("data", "model")}, ""},
  };
}

TEST(GlobalReshard, PlansTheFewestSteps) {
  const Shape shape{8, 16};
  for (const auto& c : reshard_cases())
    EXPECT_EQ(steps_of(shape, c.from, c.to), c.steps)
        << c.from.to_string() << " -> " << c.to.to_string();
}

TEST(GlobalReshard, InvalidTargetNamesTheMesh) {
  try {
    plan_redistribution({6, 4}, {P()}, {P("model")}, kMesh);
    FAIL() << "expected ShardingError";
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by 4"), std::string::npos) << e.what();
  }
}

// Every case on devices: the value is unchanged, the gradient of sum(reshard(x) * r) is r
// in x's layout, and the bytes the plan predicts are the bytes the communicator counts.
TEST(GlobalReshard, ValuesGradientsAndBytesOnDevices) {
  const Shape shape{8, 16};
  const Tensor host = testing::randn(shape, 1), r = testing::randn(shape, 2);
  const auto cases = reshard_cases();
  std::vector<std::string> failures(cases.size());
  std::mutex mu;
  testing::run_devices(kMesh, [&](spmd::DeviceContext& ctx) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      const GlobalArray x = testing::place(ctx, host, c.from);
      const std::int64_t before = ctx.comm_stats().total_bytes_sent();
      const GlobalArray y = reshard(x, c.to);
      const std::int64_t moved = ctx.comm_stats().total_bytes_sent() - before;
      const std::int64_t planned = reshard_bytes(x, c.to);
      const Tensor value = testing::to_host(y);
      GlobalTree params{{"x", x}};
      const GlobalArray rr =
          testing::place(ctx, r, c.to.partial.empty() ? c.to : GlobalSharding{c.to.spec});
      auto [loss, grads] = value_and_grad(
          [&](const GlobalTree& p) { return sum(mul(reshard(p.at("x"), c.to), rr)); }, params);
      const Tensor g = testing::to_host(
          GlobalArray(ctx, grads.at("x").local(), shape, GlobalSharding{c.from.spec}));
      std::string why;
      if (testing::rel_diff(value, host) > 1e-6) why += " value";
      if (moved != planned)
        why += " bytes " + std::to_string(moved) + " != " + std::to_string(planned);
      // A partial x's gradient is the whole cotangent on each device (its shares sum up).
      if (testing::rel_diff(g, r) > 1e-6) why += " gradient";
      std::lock_guard<std::mutex> lock(mu);
      if (!why.empty()) failures[i] += "device " + std::to_string(ctx.device()) + ":" + why + "; ";
    }
  });
  for (std::size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(failures[i], "") << cases[i].from.to_string() << " -> " << cases[i].to.to_string();
}

}  // namespace
}  // namespace distjax::global

namespace distjax::global {
namespace {

// A row-parallel product stays partial until its consumer: with_sharding_constraint to
// rows over "model" resolves it by one reduce-scatter (not an all-reduce), and the
// gradients are those of one device.
TEST(GlobalReshard, PartialResolvedLazilyByReduceScatter) {
  const Tensor a = testing::randn({8, 16}, 3), w = testing::randn({16, 8}, 4);
  const Tensor r = testing::randn({8, 8}, 5);
  // A plain variable, not a structured binding: the lambda below uses it, which clang
  // before 16 rejects for a binding.
  const tensor::TensorTree ref_g = autodiff::grad([&](const tensor::TensorTree& p) {
    return tensor::sum(tensor::mul(tensor::matmul(p.at("a"), p.at("w")), r));
  })([&] {
    tensor::TensorTree t;
    t.set("a", a);
    t.set("w", w);
    return t;
  }());
  std::vector<std::string> failures(4);
  testing::run_devices(Mesh({4}, {"model"}), [&](spmd::DeviceContext& ctx) {
    GlobalTree p{{"a", testing::place(ctx, a, {P(std::nullopt, "model")})},
                 {"w", testing::place(ctx, w, {P("model", std::nullopt)})}};
    const GlobalArray rr = testing::place(ctx, r, {P("model")});
    PlanRecorder plan;
    std::pair<GlobalArray, GlobalTree> out;
    {
      RecordPlan on(plan);
      out = value_and_grad(
          [&](const GlobalTree& q) {
            const GlobalArray y = matmul(q.at("a"), q.at("w"));  // P() partial("model")
            return sum(mul(with_sharding_constraint(y, {P("model")}), rr));
          },
          p);
    }
    std::string why = testing::join(testing::forward_collectives(plan));
    if (why != "reduce_scatter@model all_reduce@model")
      why = "collectives [" + why + "]";
    else
      why.clear();
    for (const char* k : {"a", "w"}) {
      const GlobalArray& g = out.second.at(k);
      if (testing::rel_diff(testing::to_host(g), ref_g.at(k)) > 1e-5)
        why += std::string(" gradient ") + k;
    }
    failures[static_cast<std::size_t>(ctx.device())] = why;
  });
  for (const auto& f : failures)
    EXPECT_EQ(f, "");
}

}  // namespace
}  // namespace distjax::global
