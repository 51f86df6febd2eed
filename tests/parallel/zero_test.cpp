// ZeRO-1 and ZeRO-2 against one device and against the ZeRO paper: the same losses and
// parameters as one device over 5 AdamW steps, the per-device memory of each stage
// (16, 8 + 8/N, 4 + 12/N bytes per parameter for f32 AdamW) and the communication per
// step (2 (N-1)/N x gradient bytes, as data parallelism).
#include "distjax/parallel/zero.hpp"

#include <gtest/gtest.h>

#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "parallel/parity_util.hpp"
#include "spmd/spmd_test_util.hpp"

namespace distjax::parallel {
namespace {

using mesh::Mesh;
using spmd::DeviceContext;
using testing::expect_same_run;
using testing::ParityModel;
using testing::train_on_mesh;
using testing::train_one_device;
using testing::TrainingRun;

constexpr int kSteps = 5;

const optim::AdamW& adamw() {
  static const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2),
                                 .weight_decay = 1e-2,
                                 .decay_mask = optim::default_decay_mask()});
  return opt;
}

// Sizes divisible by 8, so every leaf splits into equal chunks for N = 2, 4, 8 (808
// parameters).
const models::Classifier& classifier() {
  static const models::Classifier m(
      {.in_features = 16, .hidden = 32, .num_classes = 8, .dropout = 0.f});
  return m;
}

ParityModel classifier_model() {
  return {[](Key k, nn::ParamSpecs*, DeviceContext*) { return classifier().init(k); },
          [](const nn::Scope& s, const train::Batch& b) {
            return tensor::mean(tensor::cross_entropy(classifier()(s, b.inputs), b.labels));
          }};
}

std::vector<train::Batch> batches(std::int64_t batch) {
  std::vector<train::Batch> out;
  for (int s = 0; s < kSteps; ++s) {
    Key k = Key::from_seed(3).fold_in(static_cast<std::uint64_t>(s));
    Tensor x = testing::random_tensor(k, {batch, 16});
    std::vector<std::int32_t> y(batch);
    for (std::int64_t i = 0; i < batch; ++i)
      y[i] = static_cast<std::int32_t>(k.fold_in(50 + i).bits(0)[0] % 8);
    out.push_back({x, Tensor::from_vector(y, {batch})});
  }
  return out;
}

testing::StrategyFactory zero(int stage) {
  return [stage](DeviceContext& ctx, const nn::ParamSpecs& specs) {
    return std::make_unique<ZeroDataParallel>(ctx, stage, "data", &specs);
  };
}

// AdamW divides by sqrt(v) + eps: a gradient element near zero whose sum order differs
// in the last bits moves its parameter by up to ~lr. 2e-5 x max |value| bounds it here;
// SGD (tests/parallel/tensor_parallel_test.cpp) reaches 1e-5.
constexpr double kAdamTol = 2e-5;

TEST(Zero, Stages1And2MatchOneDevice) {
  const auto data = batches(16);
  const TrainingRun one = train_one_device(classifier_model(), adamw(), data);
  for (int n : {2, 4, 8})
    for (int stage : {1, 2})
      expect_same_run(
          one,
          train_on_mesh(Mesh({n}, {"data"}), classifier_model(), adamw(), data, {}, zero(stage)),
          kAdamTol, "ZeRO-" + std::to_string(stage) + " on " + std::to_string(n));
}

TEST(Zero, Stage2AccumulatesChunksAcrossMinibatches) {
  const auto data = batches(16);
  const TrainingRun one = train_one_device(classifier_model(), adamw(), data, /*minibatches=*/2);
  for (int stage : {1, 2})
    expect_same_run(one,
                    train_on_mesh(Mesh({2}, {"data"}), classifier_model(), adamw(), data, {},
                                  zero(stage), /*num_minibatches=*/2),
                    kAdamTol, "ZeRO-" + std::to_string(stage) + " with 2 minibatches");
}

TEST(Zero, TransformerWithTensorParallelismMatchesOneDevice) {
  // ZeRO over "data" composes with Megatron over "model": the TP shards are split again.
  models::TransformerConfig c{
      .vocab = 32, .d_model = 16, .num_layers = 2, .num_heads = 4, .mlp_ratio = 2, .max_len = 8};
  const models::Transformer plain(c);
  c.tp = {.layout = TPLayout::Megatron};
  const models::Transformer tp(c);
  auto gpt = [](const models::Transformer& m) {
    return ParityModel{
        [&m](Key k, nn::ParamSpecs* s, DeviceContext* ctx) { return m.init(k, s, ctx); },
        [&m](const nn::Scope& s, const train::Batch& b) { return m.loss(s, b.inputs, b.labels); }};
  };
  const std::vector<train::Batch> tokens = testing::random_token_batches(kSteps, 4, 8, 32, 9);
  // The gradient of the attention's key bias is zero in exact arithmetic (softmax is
  // invariant to a per-query shift), so in f32 it is rounding noise, which Adam with a
  // tiny eps would normalise to +-lr in every run differently: eps = 1e-4 keeps the
  // comparison about the computation.
  const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2),
                          .eps = 1e-4,
                          .weight_decay = 1e-2,
                          .decay_mask = optim::default_decay_mask()});
  const TrainingRun one = train_one_device(gpt(plain), opt, tokens);
  for (int stage : {1, 2})
    expect_same_run(
        one, train_on_mesh(Mesh({2, 2}, {"data", "model"}), gpt(tp), opt, tokens, {}, zero(stage)),
        kAdamTol, "ZeRO-" + std::to_string(stage) + " x TP");
}

// ------------------------------------------------------------ memory and communication

struct StepFigures {
  std::int64_t params = 0, grads = 0, opt_state = 0;  // bytes held by device 0
  std::int64_t sent = 0;                              // bytes device 0 sent for gradients
                                                      // and parameters
};

// One step through the strategy's hooks (as train_step runs them), measuring device 0.
StepFigures one_step(int n, int stage) {
  StepFigures f;
  const auto data = batches(16);
  auto run = spmd::shard_map(
      Mesh({n}, {"data"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        std::unique_ptr<train::Strategy> s;
        if (stage == 0) {
          s = std::make_unique<DataParallel>(ctx, "data", &specs);
        } else {
          s = std::make_unique<ZeroDataParallel>(ctx, stage, "data", &specs);
        }
        auto state = train::TrainState::create(classifier().init(Key::from_seed(1)), adamw(),
                                               Key::from_seed(2), *s);
        const int i = ctx.axis_index("data");
        const std::int64_t per = 16 / n;
        const ParityModel model = classifier_model();
        const train::LossFn fn = testing::parity_loss_fn(model, &ctx);
        ctx.comm_stats().reset();  // ZeRO-2 reduce-scatters inside forward_backward
        auto r = s->forward_backward(fn, state.params, data[0].slice(i * per, (i + 1) * per),
                                     Key::from_seed(3), 1);
        TensorTree grads = s->finalize_grads(std::move(r.grads));
        s->apply_update(adamw(), state.params, grads, state.opt_state, 0);
        if (ctx.device() == 0) {
          f.params = state.params.storage_bytes();
          f.grads = grads.storage_bytes();
          f.opt_state = state.opt_state.storage_bytes();
          f.sent = ctx.comm_stats().total_bytes_sent();
        }
        return std::vector<Tensor>{};
      },
      {}, {});
  run(std::vector<Tensor>{});
  return f;
}

TEST(Zero, MemoryPerDeviceIsThePapersFigure) {
  const std::int64_t p = classifier().num_params();  // 808
  for (int n : {2, 4, 8}) {
    const StepFigures dp = one_step(n, 0), z1 = one_step(n, 1), z2 = one_step(n, 2);
    // Plain data parallelism: 4 (parameters) + 4 (gradients) + 8 (Adam's mu, nu).
    EXPECT_EQ(dp.params + dp.grads + dp.opt_state, 16 * p) << "DP, N=" << n;
    // ZeRO-1: the optimizer state split: 8 + 8/N.
    EXPECT_EQ(z1.params, 4 * p);
    EXPECT_EQ(z1.grads, 4 * p);
    EXPECT_EQ(z1.opt_state, 8 * p / n);
    EXPECT_EQ(z1.params + z1.grads + z1.opt_state, 8 * p + 8 * p / n) << "ZeRO-1, N=" << n;
    // ZeRO-2: the gradients split too: 4 + 12/N.
    EXPECT_EQ(z2.grads, 4 * p / n);
    EXPECT_EQ(z2.params + z2.grads + z2.opt_state, 4 * p + 12 * p / n) << "ZeRO-2, N=" << n;
  }
}

TEST(Zero, CommunicationPerStepIsDataParallelisms) {
  const std::int64_t g = 4 * classifier().num_params();  // gradient bytes
  for (int n : {2, 4, 8}) {
    const std::int64_t ring = 2 * (n - 1) * g / n;
    EXPECT_EQ(one_step(n, 0).sent, ring) << "DP, N=" << n;
    EXPECT_EQ(one_step(n, 1).sent, ring) << "ZeRO-1, N=" << n;
    EXPECT_EQ(one_step(n, 2).sent, ring) << "ZeRO-2, N=" << n;
  }
}

TEST(Zero, TheTrainStepReportsMemoryToTheDeviceContext) {
  // DeviceContext::memory() after a train_step: the strategy's figures (as measured above
  // by storage), and an activation peak that grows with the batch.
  const std::int64_t p = classifier().num_params();
  for (int stage : {0, 1, 2}) {
    std::vector<std::int64_t> peaks;
    for (std::int64_t batch : {16, 256}) {
      MemoryStats mem;
      spmd::shard_map(Mesh({2}, {"data"}),
                      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                        std::unique_ptr<train::Strategy> s;
                        if (stage == 0) {
                          s = std::make_unique<DataParallel>(ctx, "data");
                        } else {
                          s = std::make_unique<ZeroDataParallel>(ctx, stage, "data");
                        }
                        auto state = train::TrainState::create(classifier().init(Key::from_seed(1)),
                                                               adamw(), Key::from_seed(2), *s);
                        const ParityModel model = classifier_model();
                        const train::Batch b = batches(batch)[0].slice(0, batch / 2);
                        train::train_step(state, b, testing::parity_loss_fn(model, &ctx), adamw(),
                                          {.strategy = s.get()});
                        if (ctx.device() == 0) mem = ctx.memory();
                        return std::vector<Tensor>{};
                      },
                      {}, {})(std::vector<Tensor>{});
      EXPECT_EQ(mem.parameters, 4 * p) << "stage " << stage;
      EXPECT_EQ(mem.optimizer_state, stage == 0 ? 8 * p : 8 * p / 2) << "stage " << stage;
      EXPECT_EQ(mem.gradients, stage == 2 ? 4 * p / 2 : 4 * p) << "stage " << stage;
      EXPECT_GT(mem.activations_peak, 0);
      peaks.push_back(mem.activations_peak);
    }
    EXPECT_GT(peaks[1], peaks[0]) << "stage " << stage;
  }
}

TEST(Zero, BadStageIsAClearError) {
  auto run = spmd::shard_map(Mesh({2}, {"data"}),
                             [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                               ZeroDataParallel z(ctx, 3);
                               return std::vector<Tensor>{};
                             },
                             {}, {});
  try {
    run(std::vector<Tensor>{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage must be 1 or 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distjax::parallel
