// Data parallelism against one device: the same model, data and optimizer trained on
// one device and with the batch sharded over 2 and 4 simulated devices must give the
// same losses and parameters (tolerances below: only the summation order differs).
#include "distjax/parallel/data_parallel.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::parallel {
namespace {

using mesh::Mesh;
using mesh::P;
using spmd::DeviceContext;
using tensor::Tensor;

constexpr int kSteps = 4;
constexpr std::int64_t kBatch = 16;

train::Batch make_batch(int step) {
  Key k = Key::from_seed(7).fold_in(static_cast<std::uint64_t>(step));
  Tensor x = Tensor::empty({kBatch, 8});
  random_normal(k, x.data<float>(), x.numel());
  Tensor y = Tensor::empty({kBatch}, DType::I32);
  for (std::int64_t i = 0; i < kBatch; ++i)
    y.data<std::int32_t>()[i] = static_cast<std::int32_t>(k.fold_in(100 + i).bits(0)[0] % 4);
  return {x, y};
}

const models::Classifier& model() {
  static const models::Classifier m(
      {.in_features = 8, .hidden = 16, .num_classes = 4, .dropout = 0.f});
  return m;
}

train::LossFn loss_fn() {
  return [](const TensorTree& p, const train::Batch& b, Key k) {
    Tensor logits = model().apply(p, b.inputs, true, k);
    return std::make_pair(tensor::mean(tensor::cross_entropy(logits, b.labels)), train::Metrics{});
  };
}

struct TrainingRun {
  std::vector<double> losses;
  TensorTree params;
};

TrainingRun train_one_device(const optim::Optimizer& opt) {
  auto state = train::TrainState::create(model().init(Key::from_seed(1)), opt, Key::from_seed(2));
  TrainingRun run;
  for (int s = 0; s < kSteps; ++s)
    run.losses.push_back(train::train_step(state, make_batch(s), loss_fn(), opt).mean("loss"));
  run.params = state.params;
  return run;
}

// Trains on a ("data"=n) mesh; returns device 0's losses and parameters, after checking
// (check_replicated) that every replica ends with exactly the same parameters.
TrainingRun train_data_parallel(const optim::Optimizer& opt, int n) {
  Mesh mesh({n}, {"data"});
  const TensorTree init = model().init(Key::from_seed(1));
  std::vector<std::string> paths = init.paths();
  std::vector<std::vector<double>> losses(n);
  auto f = spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        auto state = train::TrainState::create(init.map([](const Tensor& t) { return t.clone(); }),
                                               opt, Key::from_seed(2));
        const train::TrainStepOptions options{.data_parallel = {.ctx = &ctx, .axes = "data"}};
        const int i = ctx.axis_index("data");
        for (int s = 0; s < kSteps; ++s) {
          train::Batch local = make_batch(s).slice(i * kBatch / n, (i + 1) * kBatch / n);
          losses[ctx.device()].push_back(
              train::train_step(state, local, loss_fn(), opt, options).mean("loss"));
        }
        std::vector<Tensor> out;
        for (const auto& p : paths)
          out.push_back(state.params.at(p));
        return out;
      },
      {}, std::vector<mesh::PartitionSpec>(paths.size(), P()), {.check_replicated = true});
  std::vector<mesh::ShardedArray> out = f(std::vector<Tensor>{});
  TrainingRun run{losses[0], {}};
  for (std::size_t j = 0; j < paths.size(); ++j)
    run.params.set(paths[j], mesh::gather(out[j]));
  for (int d = 1; d < n; ++d)
    EXPECT_EQ(losses[d], losses[0]) << "device " << d;
  return run;
}

void expect_same_run(const TrainingRun& one, const TrainingRun& dp, double tol) {
  ASSERT_EQ(one.losses.size(), dp.losses.size());
  for (std::size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(dp.losses[s], one.losses[s], tol * std::abs(one.losses[s])) << "step " << s;
  ASSERT_TRUE(one.params.same_structure(dp.params));
  for (const auto& [path, a] : one.params) {
    auto va = a.to_vector<float>(), vb = dp.params.at(path).to_vector<float>();
    double max_ref = 0, max_diff = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(double(va[i])));
      max_diff = std::max(max_diff, std::abs(double(va[i]) - vb[i]));
    }
    EXPECT_LE(max_diff, tol * max_ref) << path;
  }
  // Training moved the parameters, so the comparison above is not vacuous.
  EXPECT_NE(one.losses.front(), one.losses.back());
}

TEST(DataParallel, SgdMatchesOneDevice) {
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.5), .momentum = 0.9});
  const TrainingRun one = train_one_device(opt);
  for (int n : {2, 4})
    expect_same_run(one, train_data_parallel(opt, n), 1e-5);
}

TEST(DataParallel, AdamWMatchesOneDevice) {
  optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2), .weight_decay = 1e-2});
  const TrainingRun one = train_one_device(opt);
  // Adam divides by sqrt(v): tiny gradient differences from the reduction order are
  // amplified where v is small, hence the looser bound.
  for (int n : {2, 4})
    expect_same_run(one, train_data_parallel(opt, n), 1e-4);
}

TEST(DataParallel, SyncGradsAveragesInBuckets) {
  Mesh mesh({2, 2}, {"data", "model"});
  auto f = spmd::shard_map(
      mesh,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        TensorTree g;
        const float d = static_cast<float>(ctx.device());
        g.set("a", Tensor::full({3}, d));
        g.set("b", Tensor::full({2, 2}, 10 * d));
        g.set("c", g.at("a"));  // shares storage with "a": must not be averaged twice
        // 16-byte buckets: "a" (12 bytes) and "b" (16 bytes) and "c" go in separate buckets.
        TensorTree s = sync_grads(ctx, g, "data", 16);
        return std::vector<Tensor>{s.at("a"), s.at("b"), s.at("c")};
      },
      {}, {P(), P(), P()});
  auto out = f(std::vector<Tensor>{});
  // Device (data, model): d = 2 * data + model; the mean over data of d is 1 + model.
  for (int dev = 0; dev < 4; ++dev) {
    const int model_index = dev % 2;
    EXPECT_EQ(out[0].shard(dev).to_vector<float>(), std::vector<float>(3, 1.f + model_index));
    EXPECT_EQ(out[1].shard(dev).to_vector<float>(),
              std::vector<float>(4, 10.f * (1 + model_index)));
    EXPECT_EQ(out[2].shard(dev).to_vector<float>(), std::vector<float>(3, 1.f + model_index));
  }
}

}  // namespace
}  // namespace distjax::parallel
