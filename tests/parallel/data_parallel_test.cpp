// Data parallelism against one device: the same model, data and optimizer trained on
// one device and with the batch sharded over 2 and 4 simulated devices must give the
// same losses and parameters (tolerances below: only the summation order differs).
#include "distjax/parallel/data_parallel.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"
#include "spmd/spmd_test_util.hpp"

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
  std::vector<float> x(kBatch * 8);
  random_normal(k, x.data(), static_cast<std::int64_t>(x.size()));
  std::vector<std::int32_t> y(kBatch);
  for (std::int64_t i = 0; i < kBatch; ++i)
    y[i] = static_cast<std::int32_t>(k.fold_in(100 + i).bits(0)[0] % 4);
  return {Tensor::from_vector(x, {kBatch, 8}), Tensor::from_vector(y, {kBatch})};
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

// How the local batch reaches the device and what the loss function does with the
// parameters: every way must give the single-device run.
enum class Feed {
  SliceInside,      // the device slices the global batch itself (a fresh, unmarked tensor)
  ThroughInSpec,    // the batch enters shard_map with in_spec P("data") (marked varying)
  UserPvaryParams,  // as ThroughInSpec, and the loss function pvary's the parameters
};

// Trains on a ("data"=n) mesh; returns device 0's losses and parameters, after checking
// (check_replicated) that every replica ends with exactly the same parameters.
TrainingRun train_data_parallel(const optim::Optimizer& opt, int n, Feed feed = Feed::SliceInside) {
  Mesh mesh({n}, {"data"});
  const TensorTree init = model().init(Key::from_seed(1));
  std::vector<std::string> paths = init.paths();
  std::vector<std::vector<double>> losses(n);
  std::vector<Tensor> inputs;
  for (int s = 0; s < kSteps; ++s) {
    inputs.push_back(make_batch(s).inputs);
    inputs.push_back(make_batch(s).labels);
  }
  auto f = spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
        auto state = train::TrainState::create(init.map([](const Tensor& t) { return t.clone(); }),
                                               opt, Key::from_seed(2));
        DataParallel dp(ctx, "data");
        const train::TrainStepOptions options{.strategy = &dp};
        train::LossFn fn = loss_fn();
        if (feed == Feed::UserPvaryParams) {
          // What the docs say a per-device region does: pvary. On parameters the data-
          // parallel strategy already treats as per-replica copies, it is the identity.
          fn = [&ctx](const TensorTree& p, const train::Batch& b, Key k) {
            TensorTree q = p.map([&](const Tensor& t) { return spmd::pvary(ctx, t, "data"); });
            return loss_fn()(q, b, k);
          };
        }
        const int i = ctx.axis_index("data");
        for (int s = 0; s < kSteps; ++s) {
          train::Batch local = feed == Feed::SliceInside
                                   ? make_batch(s).slice(i * kBatch / n, (i + 1) * kBatch / n)
                                   : train::Batch{in[2 * s], in[2 * s + 1]};
          losses[ctx.device()].push_back(
              train::train_step(state, local, fn, opt, options).mean("loss"));
        }
        std::vector<Tensor> out;
        for (const auto& p : paths)
          out.push_back(state.params.at(p));
        return out;
      },
      std::vector<mesh::PartitionSpec>(inputs.size(), P("data")),
      std::vector<mesh::PartitionSpec>(paths.size(), P()), {.check_replicated = true});
  std::vector<mesh::ShardedArray> out = f(inputs);
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

TEST(DataParallel, BatchThroughInSpecsAndUserPvaryGiveTheSameRun) {
  // A batch that arrives marked as varying over "data", and parameters the user pvary's,
  // must not change the gradient (no cotangent sum on top of the averaging).
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.5), .momentum = 0.9});
  const TrainingRun one = train_one_device(opt);
  expect_same_run(one, train_data_parallel(opt, 2, Feed::ThroughInSpec), 1e-5);
  expect_same_run(one, train_data_parallel(opt, 4, Feed::UserPvaryParams), 1e-5);
}

TEST(DataParallel, OverlappedBucketsStartDuringBackwardAndGiveTheSyncAverages) {
  // loss = sum(tanh(x W0) W1 ...) with a marker op under the first layer: when the
  // backward pass reaches the marker, the buckets of the layers above must have been
  // handed to the all-reduce already. Small buckets, so there are several.
  const int n = 2;
  std::vector<std::int64_t> started_at_bottom(n, -1);
  std::vector<TensorTree> with(n), without(n);
  spmd::shard_map(
      Mesh({n}, {"data"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        TensorTree params;
        for (const char* name : {"w0", "w1", "w2", "w3"})
          params.set(name, testing::random_tensor(Key::from_seed(1).fold_in(std::string_view(name)),
                                                  {8, 8}));
        const int i = ctx.axis_index("data");
        const train::Batch batch{testing::random_tensor(Key::from_seed(2).fold_in(i), {4, 8}),
                                 Tensor::zeros({4}, DType::I32)};
        DataParallel* active = nullptr;
        train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key) {
          Tensor h = autodiff::custom_vjp1(
              "marker", {b.inputs},
              [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
              [&](const std::vector<Tensor>&, const std::vector<Tensor>&,
                  const std::vector<Tensor>& g) {
                if (active != nullptr)
                  started_at_bottom[ctx.device()] =
                      static_cast<std::int64_t>(active->started_buckets());
                return std::vector<Tensor>{g[0]};
              });
          for (const char* name : {"w0", "w1", "w2", "w3"})
            h = tensor::tanh(tensor::matmul(h, p.at(name)));
          return std::make_pair(tensor::mean(h), train::Metrics{});
        };
        for (bool overlap : {true, false}) {
          DataParallel dp(ctx, "data", nullptr,
                          {.bucket_bytes = 2 * 8 * 8 * 4, .overlap = overlap});
          active = &dp;
          ctx.comm_stats().reset();
          // The marker's input must require grad for its backward to run.
          train::Batch b = batch;
          b.inputs = tensor::make_leaf(b.inputs);
          auto r = dp.forward_backward(fn, params, b, Key{}, 1);
          (overlap ? with : without)[ctx.device()] = dp.finalize_grads(std::move(r.grads));
          if (overlap) {
            // 4 leaves of 256 bytes in buckets of 512: two all-reduces, both started
            // before the backward pass reached the bottom.
            EXPECT_EQ(started_at_bottom[ctx.device()], 2);
          }
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  for (int d = 0; d < n; ++d)
    for (const auto& [path, g] : without[d])
      EXPECT_EQ(with[d].at(path).to_vector<float>(), g.to_vector<float>()) << path;
}

// AdamW that records the parameter paths of each update call.
class RecordingAdamW final : public optim::Optimizer {
 public:
  explicit RecordingAdamW(bool per_leaf) : per_leaf_(per_leaf) {}
  TensorTree init(const TensorTree& params) const override { return inner_.init(params); }
  void update(TensorTree& params, const TensorTree& grads, TensorTree& state,
              std::int64_t step) const override {
    std::vector<std::string> paths;
    for (const auto& [path, p] : params)
      paths.push_back(path);
    calls.push_back(paths);
    inner_.update(params, grads, state, step);
  }
  double learning_rate(std::int64_t step) const override { return inner_.learning_rate(step); }
  std::string name() const override { return "recording_adamw"; }
  bool updates_per_leaf() const override { return per_leaf_; }
  mutable std::vector<std::vector<std::string>> calls;

 private:
  optim::AdamW inner_{{.learning_rate = optim::constant_schedule(1e-2), .weight_decay = 0.1}};
  bool per_leaf_;
};

TEST(DataParallel, StreamedUpdateUpdatesEachBucketAsItArrivesWithTheSameResult) {
  // Four 8x8 weights in 512-byte buckets over data=2: without clipping the train step
  // updates each bucket once its all-reduce is done (the last layer's first); with
  // clipping (a bound never reached), or an optimizer that does not update per leaf,
  // once after all of them. The parameters must be the same bits.
  const int n = 2, steps = 3;
  enum Mode { Streamed, Clipped, NotPerLeaf };
  std::vector<std::vector<TensorTree>> params(3, std::vector<TensorTree>(n));
  std::vector<std::vector<std::vector<std::string>>> calls(3);
  spmd::shard_map(
      Mesh({n}, {"data"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const int i = ctx.axis_index("data");
        train::LossFn fn = [](const TensorTree& p, const train::Batch& b, Key) {
          Tensor h = b.inputs;
          for (const char* name : {"w0", "w1", "w2", "w3"})
            h = tensor::tanh(tensor::matmul(h, p.at(name)));
          return std::make_pair(tensor::mean(h), train::Metrics{});
        };
        for (Mode mode : {Streamed, Clipped, NotPerLeaf}) {
          TensorTree init;
          for (const char* name : {"w0", "w1", "w2", "w3"})
            init.set(name, testing::random_tensor(Key::from_seed(1).fold_in(std::string_view(name)),
                                                  {8, 8}));
          init.set("n", Tensor::zeros({1}, DType::I32));  // an integer leaf: not trained
          RecordingAdamW opt(mode != NotPerLeaf);
          DataParallel dp(ctx, "data", nullptr, {.bucket_bytes = 2 * 8 * 8 * 4, .overlap = true});
          train::TrainState state = train::TrainState::create(init, opt, Key::from_seed(3), dp);
          for (int s = 0; s < steps; ++s) {
            const train::Batch batch{
                testing::random_tensor(Key::from_seed(2).fold_in(s * n + i), {4, 8}),
                Tensor::zeros({4}, DType::I32)};
            train::train_step(state, batch, fn, opt,
                              {.max_grad_norm = mode == Clipped ? 1e9 : 0.0, .strategy = &dp});
          }
          params[mode][ctx.device()] = state.params;
          if (ctx.device() == 0) calls[mode] = opt.calls;
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  const std::vector<std::string> all = {"w0", "w1", "w2", "w3"};
  ASSERT_EQ(calls[Streamed].size(), 2u * steps);
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(calls[Streamed][2 * s], (std::vector<std::string>{"w2", "w3"}));
    EXPECT_EQ(calls[Streamed][2 * s + 1], (std::vector<std::string>{"w0", "w1"}));
  }
  for (Mode mode : {Clipped, NotPerLeaf}) {
    ASSERT_EQ(calls[mode].size(), static_cast<std::size_t>(steps));
    for (const auto& c : calls[mode])
      EXPECT_EQ(c, (std::vector<std::string>{"n", "w0", "w1", "w2", "w3"}));
  }
  for (int d = 0; d < n; ++d)
    for (const std::string& path : all)
      for (Mode mode : {Clipped, NotPerLeaf})
        EXPECT_EQ(params[Streamed][d].at(path).to_vector<float>(),
                  params[mode][d].at(path).to_vector<float>())
            << path << " mode " << mode;
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
        // Per-device values: they vary over both axes.
        auto per_device = [&](Tensor t) { return spmd::pvary(ctx, t, {"data", "model"}); };
        const float d = static_cast<float>(ctx.device());
        g.set("a", per_device(Tensor::full({3}, d)));
        g.set("b", per_device(Tensor::full({2, 2}, 10 * d)));
        g.set("c", g.at("a"));  // shares storage with "a": must not be averaged twice
        // 16-byte buckets: "a" (12 bytes) and "b" (16 bytes) and "c" go in separate buckets.
        TensorTree s = sync_grads(ctx, g, "data", nullptr, 16);
        // Averaged over "data": they still vary over "model" only.
        EXPECT_EQ(ctx.varying_axes(s.at("a")), mesh::Axes("model"));
        return std::vector<Tensor>{s.at("a"), s.at("b"), s.at("c")};
      },
      {}, {P("model"), P("model"), P("model")});
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

TEST(DataParallel, SyncGradsReadsEachLeafsSpec) {
  // On ("data"=2, "model"=2): a replicated leaf is averaged over "data"; a leaf sharded
  // over "model" too (its shard's gradient, averaged over the replicas of that shard); a
  // leaf sharded over "data" (fully sharded) is its own and left alone.
  Mesh mesh({2, 2}, {"data", "model"});
  const ParamSpecs specs{{"rep", P()}, {"tp", P("model")}, {"fsdp", P("data")}};
  auto f =
      spmd::shard_map(mesh,
                      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                        const float d = static_cast<float>(ctx.device());
                        TensorTree g;
                        for (const char* name : {"rep", "tp", "fsdp"})
                          g.set(name, spmd::pvary(ctx, Tensor::full({2}, d), {"data", "model"}));
                        TensorTree s = sync_grads(ctx, g, "data", &specs);
                        return std::vector<Tensor>{s.at("rep"), s.at("tp"), s.at("fsdp")};
                      },
                      {}, {P("model"), P("model"), P({"data", "model"})});
  auto out = f(std::vector<Tensor>{});
  for (int dev = 0; dev < 4; ++dev) {
    const float averaged = 1.f + dev % 2;  // mean over data of 2 * data + model
    EXPECT_EQ(out[0].shard(dev).to_vector<float>(), std::vector<float>(2, averaged)) << dev;
    EXPECT_EQ(out[1].shard(dev).to_vector<float>(), std::vector<float>(2, averaged)) << dev;
    EXPECT_EQ(out[2].shard(dev).to_vector<float>(), std::vector<float>(2, float(dev))) << dev;
  }
}

TEST(DataParallel, SyncMetricsMatchesByNameInDoublePrecision) {
  Mesh mesh = Mesh::line(2);
  std::vector<train::Metrics> got(2);
  auto f = spmd::shard_map(mesh,
                           [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                             const int i = ctx.axis_index("data");
                             train::Metrics m;
                             // Counts beyond 2^24 and sums that f32 would round.
                             m.add("loss", 1e9 + 0.25 * (i + 1), 33554433.0);
                             m.add("accuracy", i == 0 ? 3 : 4, 10);
                             got[i] = sync_metrics(ctx, m, "data");
                             train::Metrics odd;
                             odd.add(i == 0 ? "loss" : "lost", 1, 1);
                             EXPECT_THROW(sync_metrics(ctx, odd, "data"), InvalidArgument);
                             return std::vector<Tensor>{};
                           },
                           {}, {});
  f(std::vector<Tensor>{});
  for (const auto& m : got) {
    EXPECT_EQ(m.at("loss").sum, 2e9 + 0.75);
    EXPECT_EQ(m.at("loss").count, 67108866.0);
    EXPECT_EQ(m.at("accuracy").sum, 7.0);
  }
}

// A hand-written shard_map program whose weight is split over "data" (a kernel_spec naming
// the data axis, no fully sharded storage) would train a different slice on each replica
// as if it were the whole weight: DataParallel (and ZeroDataParallel, built on it) refuses
// it at the first step, naming the parameter; declared fully sharded, it is accepted.
TEST(DataParallel, AWeightSplitOverDataWithoutFullShardingIsRefused) {
  enum class Built { Plain, Zero1, FullySharded };
  for (Built built : {Built::Plain, Built::Zero1, Built::FullySharded}) {
    std::vector<std::string> errors(2);
    spmd::shard_map(
        Mesh({2}, {"data"}),
        [&](DeviceContext& ctx, const std::vector<Tensor>&) {
          const auto forward = [](const nn::Scope& s, const Tensor& x) {
            return nn::Dense{.features = 4,
                             .kernel_spec = P(std::nullopt, "data"),
                             .bias_spec = P("data")}(s.child("fc"), x);
          };
          nn::ParamSpecs specs;
          TensorTree params;
          {
            tensor::NoGradGuard no_grad;
            forward(nn::Scope::init(&params, Key::from_seed(1), &specs).on(ctx),
                    Tensor::zeros({1, 8}));
          }
          std::unique_ptr<train::Strategy> strategy;
          if (built == Built::Zero1)
            strategy = std::make_unique<ZeroDataParallel>(ctx, 1, "data", &specs);
          else
            strategy = std::make_unique<DataParallel>(
                ctx, "data", &specs,
                DataParallelOptions{.fully_sharded = built == Built::FullySharded
                                                         ? mesh::Axes("data")
                                                         : mesh::Axes()});
          const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
          auto state = train::TrainState::create(params, opt, Key::from_seed(2), *strategy);
          const train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
            const nn::Scope s = nn::Scope::apply(&p, true, k).on(ctx);
            return std::make_pair(tensor::mean(forward(s, b.inputs)), train::Metrics{});
          };
          try {
            train::train_step(state, make_batch(0).slice(0, 8), fn, opt,
                              {.strategy = strategy.get()});
          } catch (const ShardingError& e) {
            errors[ctx.device()] = e.what();
          }
          return std::vector<Tensor>{};
        },
        {}, {})(std::vector<Tensor>{});
    for (const std::string& e : errors) {
      if (built == Built::FullySharded) {
        EXPECT_EQ(e, "");
      } else {
        EXPECT_NE(e.find("parameter \"fc/kernel\" is split over data axis"), std::string::npos)
            << e;
        EXPECT_NE(e.find("silently train different models"), std::string::npos) << e;
      }
    }
  }
}

}  // namespace
}  // namespace distjax::parallel
