#include "distjax/train/train_step.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "distjax/data/synthetic.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::train {
namespace {

// Softmax regression: loss = mean cross-entropy, metrics: accuracy.
std::pair<Tensor, Metrics> linear_loss(const TensorTree& p, const Batch& b, Key) {
  Tensor logits = tensor::linear(b.inputs, p.at("dense/kernel"), p.at("dense/bias"));
  Tensor loss = tensor::mean(tensor::cross_entropy(logits, b.labels));
  Metrics m;
  auto pred = tensor::argmax(logits, -1).to_vector<std::int64_t>();
  auto y = b.labels.to_vector<std::int32_t>();
  double correct = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    correct += pred[i] == y[i];
  m.add("accuracy", correct, static_cast<double>(y.size()));
  return {loss, m};
}

TensorTree linear_params(std::int64_t in, std::int64_t out, Key key) {
  TensorTree p;
  Tensor w = Tensor::empty({in, out}, DType::F32, Device::cpu());
  random_normal(key, w.data<float>(), w.numel());
  p.set("dense/kernel", tensor::mul_scalar(w.to(current_device()), 0.1));
  p.set("dense/bias", Tensor::zeros({out}));
  return p;
}

TEST(Metrics, SumsAndCountsMergeExactly) {
  Metrics a, b;
  a.add("loss", 3.0, 2.0);
  b.add("loss", 1.0, 2.0);
  b.add("accuracy", 1.0, 4.0);
  a.merge(b);
  EXPECT_DOUBLE_EQ(a.at("loss").sum, 4.0);
  EXPECT_DOUBLE_EQ(a.at("loss").count, 4.0);
  EXPECT_DOUBLE_EQ(a.mean("loss"), 1.0);
  EXPECT_DOUBLE_EQ(a.mean("accuracy"), 0.25);
  EXPECT_EQ(a.means().size(), 2u);
  EXPECT_THROW(a.at("bleu"), InvalidArgument);
  EXPECT_TRUE(std::isnan(Metric{}.mean()));
}

// A sum still on a device is read when the metric is, in the order the sums were added
// (host sums after it wait their turn), and merging reads nothing.
TEST(Metrics, ValuesOnADeviceAreReadWhenReportedInTheOrderAdded) {
  const Device checked{DeviceKind::Checked, 0};
  auto on_device = [&](float v) { return Tensor::from_vector<float>({v}, {}, checked); };
  Metrics a;
  a.add("loss", 1e16, 1.0);
  a.add("loss", on_device(1.f), 3.0, 2.0);  // adds 3
  a.add("loss", -1e16, 1.0);                // in order: (1e16 + 3) rounds to 1e16 + 4
  EXPECT_TRUE(a.pending("loss"));
  EXPECT_TRUE(a.pending());
  Metrics b;
  b.add("loss", on_device(0.5f), 2.0, 1.0);
  b.add("accuracy", 1.0, 2.0);
  const std::int64_t waits = tensor::host_waits(DeviceKind::Checked);
  a.merge(b);
  EXPECT_TRUE(a.contains("loss"));
  EXPECT_FALSE(a.pending("accuracy"));
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked), waits) << "merge read a value";
  EXPECT_EQ(a.at("loss").sum, 4.0 + 1.0);
  EXPECT_EQ(a.at("loss").count, 5.0);
  EXPECT_GT(tensor::host_waits(DeviceKind::Checked), waits);
  EXPECT_FALSE(a.pending());
  EXPECT_EQ(a.mean("accuracy"), 0.5);
  // A metric keeps at most 256 values on a device; the 256th reads them all.
  Metrics many;
  for (int i = 1; i <= 255; ++i) many.add("loss", on_device(static_cast<float>(i)), 1.0, 1.0);
  EXPECT_TRUE(many.pending("loss"));
  many.add("loss", on_device(256.f), 1.0, 1.0);
  EXPECT_FALSE(many.pending("loss"));
  EXPECT_EQ(many.at("loss").sum, 256.0 * 257.0 / 2.0);
  // A CPU value is read at once; a value must be one floating element.
  Metrics c;
  c.add("x", Tensor::from_vector<float>({2.f}, {1}, Device::cpu()), 1.5, 1.0);
  EXPECT_FALSE(c.pending());
  EXPECT_EQ(c.at("x").sum, 3.0);
  EXPECT_THROW(c.add("x", Tensor::zeros({2}, DType::F32, checked), 1.0, 1.0), InvalidArgument);
  EXPECT_THROW(c.add("x", Tensor::zeros({}, DType::I32, checked), 1.0, 1.0), InvalidArgument);
  EXPECT_THROW(c.add("x", Tensor(), 1.0, 1.0), InvalidArgument);
}

// Reading metrics waits for the device once, however many values it holds: they are
// gathered there (bf16 widened exactly) and read together, and sum in the order added.
TEST(Metrics, ValuesOnADeviceAreReadWithOneWait) {
  const Device checked{DeviceKind::Checked, 0};
  Metrics m;
  double want_loss = 0, want_acc = 0;
  for (int i = 0; i < 40; ++i) {
    const float v = 0.1f * static_cast<float>(i) + 1e-3f;
    m.add("loss", Tensor::from_vector<float>({v}, {}, checked), 0.25, 1.0);
    want_loss += static_cast<double>(v) * 0.25;
    const Tensor h = tensor::astype(Tensor::from_vector<float>({v}, {1}, checked), DType::BF16);
    m.add("accuracy", h, 1.0, 1.0);
    want_acc += static_cast<double>(static_cast<float>(bf16(v)));
  }
  const std::int64_t waits = tensor::host_waits(DeviceKind::Checked);
  const std::map<std::string, double> means = m.means();
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked) - waits, 1);
  EXPECT_EQ(m.at("loss").sum, want_loss);
  EXPECT_EQ(m.at("accuracy").sum, want_acc);
  EXPECT_EQ(means.at("loss"), want_loss / 40.0);
}

TEST(Batch, SliceSharesStorageAndChecksSizes) {
  Batch b{Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}),
          Tensor::from_vector<std::int32_t>({7, 8, 9}, {3})};
  EXPECT_EQ(b.size(), 3);
  Batch s = b.slice(1, 3);
  EXPECT_EQ(s.inputs.to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(s.labels.to_vector<std::int32_t>(), (std::vector<std::int32_t>{8, 9}));
  EXPECT_TRUE(s.inputs.shares_storage_with(b.inputs));
  EXPECT_THROW(b.slice(2, 4), InvalidArgument);
  Batch bad{Tensor::zeros({3, 2}), Tensor::zeros({2}, DType::I32)};
  EXPECT_THROW(bad.size(), InvalidArgument);
}

TEST(AccumulateGradients, MinibatchMeanEqualsFullBatchGradient) {
  data::ArrayDataset d = data::synthetic_classification(24, 5, 3, Key::from_seed(1));
  Batch batch{d.inputs, d.labels};
  TensorTree params = linear_params(5, 3, Key::from_seed(2));
  GradientResult full = accumulate_gradients(linear_loss, params, batch, Key::from_seed(0), 1);
  for (int k : {2, 3, 4, 8}) {
    GradientResult acc = accumulate_gradients(linear_loss, params, batch, Key::from_seed(0), k);
    EXPECT_DOUBLE_EQ(acc.metrics.at("accuracy").sum, full.metrics.at("accuracy").sum);
    EXPECT_DOUBLE_EQ(acc.metrics.at("loss").count, 24.0);
    EXPECT_NEAR(acc.metrics.mean("loss"), full.metrics.mean("loss"), 1e-6) << k << " minibatches";
    for (const auto& [path, g] : full.grads) {
      auto a = acc.grads.at(path).to_vector<float>();
      auto f = g.to_vector<float>();
      ASSERT_EQ(a.size(), f.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(a[i], f[i], 1e-6) << path << "[" << i << "], " << k << " minibatches";
    }
  }
  // A single minibatch differs from the full batch: the test above can fail.
  GradientResult part =
      accumulate_gradients(linear_loss, params, batch.slice(0, 6), Key::from_seed(0), 1);
  EXPECT_GT(std::fabs(part.metrics.mean("loss") - full.metrics.mean("loss")), 1e-4);
}

TEST(AccumulateGradients, IndivisibleBatchIsAnError) {
  data::ArrayDataset d = data::synthetic_classification(10, 5, 3, Key::from_seed(1));
  TensorTree params = linear_params(5, 3, Key::from_seed(2));
  try {
    accumulate_gradients(linear_loss, params, Batch{d.inputs, d.labels}, Key::from_seed(0), 4);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 10 is not divisible by num_minibatches 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(AccumulateGradients, MinibatchesGetDistinctKeys) {
  std::vector<Key> seen;
  LossFn fn = [&](const TensorTree& p, const Batch& b, Key k) {
    seen.push_back(k);
    return linear_loss(p, b, k);
  };
  data::ArrayDataset d = data::synthetic_classification(8, 5, 3, Key::from_seed(1));
  accumulate_gradients(fn, linear_params(5, 3, Key::from_seed(2)), Batch{d.inputs, d.labels},
                       Key::from_seed(9), 4);
  ASSERT_EQ(seen.size(), 4u);
  for (std::size_t i = 0; i < seen.size(); ++i)
    for (std::size_t j = i + 1; j < seen.size(); ++j)
      EXPECT_FALSE(seen[i] == seen[j]);
}

TEST(TrainStep, SgdStepMatchesManualUpdateAndAdvancesStep) {
  data::ArrayDataset d = data::synthetic_classification(16, 4, 3, Key::from_seed(3));
  Batch batch{d.inputs, d.labels};
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.5)});
  TrainState state =
      TrainState::create(linear_params(4, 3, Key::from_seed(4)), opt, Key::from_seed(5));
  TensorTree before = state.params.map([](const Tensor& t) { return t.clone(); });
  GradientResult g = accumulate_gradients(linear_loss, state.params, batch,
                                          state.rng.fold_in(std::uint64_t{0}), 1);
  Metrics m = train_step(state, batch, linear_loss, opt, {.num_minibatches = 2});
  EXPECT_EQ(state.step, 1);
  EXPECT_DOUBLE_EQ(m.mean("learning_rate"), 0.5);
  EXPECT_GT(m.mean("grad_norm"), 0.0);
  for (const auto& [path, p] : state.params) {
    auto now = p.to_vector<float>(), old = before.at(path).to_vector<float>();
    auto gv = g.grads.at(path).to_vector<float>();
    for (std::size_t i = 0; i < now.size(); ++i)
      EXPECT_NEAR(now[i], old[i] - 0.5f * gv[i], 1e-6);
  }
}

TEST(TrainStep, ClippingBoundsTheUpdate) {
  data::ArrayDataset d = data::synthetic_classification(16, 4, 3, Key::from_seed(3));
  optim::SGD opt({.learning_rate = optim::constant_schedule(1.0)});
  TrainState state =
      TrainState::create(linear_params(4, 3, Key::from_seed(4)), opt, Key::from_seed(5));
  TensorTree before = state.params.map([](const Tensor& t) { return t.clone(); });
  Metrics m =
      train_step(state, Batch{d.inputs, d.labels}, linear_loss, opt, {.max_grad_norm = 1e-3});
  EXPECT_GT(m.mean("grad_norm"), 1e-3);  // reported before clipping
  double moved = 0;
  for (const auto& [path, p] : state.params) {
    auto now = p.to_vector<float>(), old = before.at(path).to_vector<float>();
    for (std::size_t i = 0; i < now.size(); ++i)
      moved += double(now[i] - old[i]) * (now[i] - old[i]);
  }
  EXPECT_NEAR(std::sqrt(moved), 1e-3, 1e-5);
}

TEST(TrainStep, AdamLearnsTheSyntheticTask) {
  data::ArrayDataset d = data::synthetic_classification(256, 8, 4, Key::from_seed(7));
  Batch batch{d.inputs, d.labels};
  optim::Adam opt({.learning_rate = optim::constant_schedule(0.05)});
  TrainState state =
      TrainState::create(linear_params(8, 4, Key::from_seed(8)), opt, Key::from_seed(0));
  Metrics first = eval_step(state.params, batch, linear_loss, Key());
  for (int s = 0; s < 150; ++s)
    train_step(state, batch, linear_loss, opt, {.num_minibatches = 4});
  Metrics last =
      evaluate(state.params, {batch.slice(0, 128), batch.slice(128, 256)}, linear_loss, Key());
  EXPECT_LT(last.mean("loss"), 0.5 * first.mean("loss"));
  EXPECT_GT(last.mean("accuracy"), 0.9);
  EXPECT_DOUBLE_EQ(last.at("accuracy").count, 256.0);
}

}  // namespace
}  // namespace distjax::train

#include "distjax/models/classifier.hpp"

namespace distjax::train {
namespace {

TEST(AccumulateGradients, ClassifierMinibatchesMatchFullBatch) {
  models::Classifier model({.in_features = 12, .hidden = 16, .num_classes = 4, .dropout = 0.f});
  LossFn fn = [&](const TensorTree& p, const Batch& b, Key k) {
    Tensor logits = model.apply(p, b.inputs, true, k);
    return std::make_pair(tensor::mean(tensor::cross_entropy(logits, b.labels)), Metrics{});
  };
  data::ArrayDataset d = data::synthetic_classification(32, 12, 4, Key::from_seed(3));
  TensorTree params = model.init(Key::from_seed(1));
  GradientResult full = accumulate_gradients(fn, params, Batch{d.inputs, d.labels}, Key(), 1);
  GradientResult acc = accumulate_gradients(fn, params, Batch{d.inputs, d.labels}, Key(), 4);
  ASSERT_EQ(acc.grads.paths(), params.paths());
  EXPECT_NEAR(acc.metrics.mean("loss"), full.metrics.mean("loss"), 1e-6);
  for (const auto& [path, g] : full.grads) {
    auto a = acc.grads.at(path).to_vector<float>();
    auto f = g.to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], f[i], 2e-6) << path << "[" << i << "]";
  }
}

}  // namespace
}  // namespace distjax::train
