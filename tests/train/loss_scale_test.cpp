// Dynamic loss scaling (f16 training): the scale's rule, a power-of-two scale that changes
// nothing in f32, an overflow injected on one device of a data-parallel mesh that skips the
// step on every device and halves the scale, which then grows back, and a real f16
// overflow from too large a scale that the scale backs off from.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "distjax/models/classifier.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::train {
namespace {

using tensor::Tensor;

constexpr std::int64_t kBatch = 16;

Batch make_batch(int step) {
  Key k = Key::from_seed(7).fold_in(static_cast<std::uint64_t>(step));
  Tensor x = Tensor::empty({kBatch, 8}, DType::F32, Device::cpu());
  random_normal(k, x.data<float>(), x.numel());
  std::vector<std::int32_t> y(kBatch);
  for (std::int64_t i = 0; i < kBatch; ++i)
    y[i] = static_cast<std::int32_t>(k.fold_in(100 + i).bits(0)[0] % 4);
  return {x.to(current_device()), Tensor::from_vector(y, {kBatch})};
}

const models::Classifier& model() {
  static const models::Classifier m({.in_features = 8, .hidden = 16, .num_classes = 4});
  return m;
}

// The classifier's loss under `precision`; `poison` (when it returns true) multiplies this
// device's loss by infinity: an overflow injected into its gradients.
LossFn loss_fn(nn::Precision precision, std::function<bool()> poison = {}) {
  return [precision, poison](const TensorTree& p, const Batch& b, Key k) {
    Tensor logits = model()(nn::Scope::apply(&p, true, k).with_precision(precision), b.inputs);
    Tensor loss = tensor::mean(tensor::cross_entropy(logits, b.labels));
    if (poison && poison())
      loss = tensor::mul_scalar(loss, std::numeric_limits<double>::infinity());
    return std::make_pair(loss, Metrics{});
  };
}

TEST(DynamicLossScale, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  DynamicLossScale s{.scale = 8, .growth_interval = 3, .min_scale = 2};
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale, 8);
  s.update(true);
  EXPECT_EQ(s.scale, 16);
  EXPECT_EQ(s.good_steps, 0);
  s.update(true);
  s.update(false);  // the counter restarts
  EXPECT_EQ(s.scale, 8);
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_EQ(s.skipped_steps, 1);
  for (int i = 0; i < 5; ++i)
    s.update(false);
  EXPECT_EQ(s.scale, 2);  // not below min_scale
  EXPECT_EQ(s.skipped_steps, 6);
}

TEST(LossScaling, PowerOfTwoScaleInF32ChangesNothing) {
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.5), .momentum = 0.9});
  TrainState plain = TrainState::create(model().init(Key::from_seed(1)), opt, Key::from_seed(2));
  TrainState scaled = plain;
  scaled.params = plain.params.map([](const Tensor& t) { return t.clone(); });
  scaled.opt_state = plain.opt_state.map([](const Tensor& t) { return t.clone(); });
  scaled.loss_scale = DynamicLossScale{.scale = 1024};
  for (int s = 0; s < 3; ++s) {
    const Metrics a = train_step(plain, make_batch(s), loss_fn(nn::Precision::f32()), opt);
    const Metrics b = train_step(scaled, make_batch(s), loss_fn(nn::Precision::f32()), opt);
    EXPECT_EQ(a.mean("loss"), b.mean("loss"));  // the metric is the unscaled loss
    EXPECT_DOUBLE_EQ(a.mean("grad_norm"), b.mean("grad_norm"));
    EXPECT_EQ(b.mean("loss_scale"), 1024);
    EXPECT_EQ(b.mean("skipped_steps"), 0);
  }
  for (const auto& [path, t] : plain.params)
    EXPECT_EQ(t.to_vector<float>(), scaled.params.at(path).to_vector<float>()) << path;
}

TEST(LossScaling, OverflowOnOneDeviceSkipsTheStepEverywhereThenTheScaleGrowsBack) {
  // Steps 0..4 on ("data"=2); device 1 overflows at step 1 only. growth_interval = 2.
  const int n = 2, steps = 5;
  std::vector<std::vector<double>> scales(n), skipped(n);
  std::vector<TensorTree> before_skip(n), after_skip(n), final_params(n);
  std::vector<DynamicLossScale> final_scale(n);
  spmd::shard_map(
      mesh::Mesh({n}, {"data"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        const int d = ctx.device();
        optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
        parallel::DataParallel dp(ctx, "data");
        TrainState state =
            TrainState::create(model().init(Key::from_seed(1)), opt, Key::from_seed(2), dp);
        state.loss_scale = DynamicLossScale{.scale = 1024, .growth_interval = 2};
        auto copy = [](const TensorTree& t) {
          return t.map([](const Tensor& x) { return x.clone(); });
        };
        const LossFn fn = loss_fn(nn::Precision::fp16(), [&] { return d == 1 && state.step == 1; });
        for (int s = 0; s < steps; ++s) {
          const Batch global = make_batch(s);
          if (s == 1) before_skip[d] = copy(state.params);
          const Metrics m = train_step(state, global.slice(d * kBatch / n, (d + 1) * kBatch / n),
                                       fn, opt, {.strategy = &dp});
          if (s == 1) after_skip[d] = copy(state.params);
          scales[d].push_back(m.mean("loss_scale"));
          skipped[d].push_back(m.mean("skipped_steps"));
          if (s == 1) {
            EXPECT_FALSE(std::isfinite(m.mean("grad_norm")));
          } else {
            EXPECT_TRUE(std::isfinite(m.mean("loss")));
            EXPECT_TRUE(std::isfinite(m.mean("grad_norm")));
          }
        }
        final_params[d] = state.params;
        final_scale[d] = *state.loss_scale;
        EXPECT_EQ(state.step, steps);  // a skipped step still counts (its batch was used)
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  for (int d = 0; d < n; ++d) {
    SCOPED_TRACE(d);
    // The scale each step used: 1024, 1024 (overflow: halve), 512, 512 (2 good: grow), 1024.
    EXPECT_EQ(scales[d], (std::vector<double>{1024, 1024, 512, 512, 1024}));
    EXPECT_EQ(skipped[d], (std::vector<double>{0, 1, 1, 1, 1}));
    EXPECT_EQ(final_scale[d].scale, 1024);
    EXPECT_EQ(final_scale[d].skipped_steps, 1);
    for (const auto& [path, t] : before_skip[d]) {
      EXPECT_EQ(t.to_vector<float>(), after_skip[d].at(path).to_vector<float>()) << path;
      EXPECT_EQ(final_params[d].at(path).to_vector<float>(),
                final_params[0].at(path).to_vector<float>());
      for (float v : final_params[d].at(path).to_vector<float>())
        ASSERT_TRUE(std::isfinite(v)) << path;
    }
  }
}

TEST(LossScaling, TooLargeAScaleOverflowsF16AndBacksOff) {
  // With scale 2^40 the f16 cotangents of the matmuls overflow (f16 ends at 65504); the
  // scale halves on each overflow until the gradients fit, and training goes on.
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.3)});
  TrainState state = TrainState::create(model().init(Key::from_seed(1)), opt, Key::from_seed(2));
  state.loss_scale = DynamicLossScale{.scale = std::ldexp(1.0, 40), .growth_interval = 1000};
  std::vector<double> losses;
  for (int s = 0; s < 60; ++s)
    losses.push_back(
        train_step(state, make_batch(s % 4), loss_fn(nn::Precision::fp16()), opt).mean("loss"));
  EXPECT_GT(state.loss_scale->skipped_steps, 5);
  EXPECT_LT(state.loss_scale->scale, std::ldexp(1.0, 35));
  EXPECT_GE(state.loss_scale->scale, 1.0);
  EXPECT_LT(losses.back(), 0.9 * losses.front());  // it trained once the scale fitted
  for (const auto& [path, t] : state.params) {
    EXPECT_EQ(t.dtype(), DType::F32);
    for (float v : t.to_vector<float>())
      ASSERT_TRUE(std::isfinite(v)) << path;
  }
}

}  // namespace
}  // namespace distjax::train
