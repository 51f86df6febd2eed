// Training on the checked device, against the CPU: the same steps (data, initialisation,
// forward, backward, clipping, the optimizer's update, checkpoints) give bitwise equal
// losses, gradients and parameters, and touch tensor data only through the kernel table
// (any other host access kills the test, naming the last op).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "distjax/data/synthetic.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/clip.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/update_ops.hpp"
#include "distjax/train/checkpoint.hpp"
#include "distjax/train/train_step.hpp"
#include "distjax/train/trainer.hpp"

namespace distjax::train {
namespace {

namespace fs = std::filesystem;
using tensor::Tensor;
using tensor::TensorTree;

const Device kChecked{DeviceKind::Checked, 0};

// The bytes of a tensor, read through the table.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  const auto* p = static_cast<const unsigned char*>(host.raw_data());
  return {p, p + host.nbytes()};
}

// Same leaves, shapes, dtypes and bytes; every leaf of `on` on `device`.
void expect_bitwise_equal(const TensorTree& want, const TensorTree& on, Device device,
                          const std::string& what) {
  ASSERT_EQ(want.size(), on.size()) << what;
  for (const auto& [path, w] : want) {
    ASSERT_TRUE(on.contains(path)) << what << " " << path;
    const Tensor& t = on.at(path);
    EXPECT_EQ(t.device(), device) << what << " " << path;
    EXPECT_EQ(t.dtype(), w.dtype()) << what << " " << path;
    EXPECT_EQ(t.shape(), w.shape()) << what << " " << path;
    EXPECT_TRUE(bytes_of(t) == bytes_of(w)) << what << " " << path << " differs";
  }
}

void expect_metrics_equal(const Metrics& want, const Metrics& got, const std::string& what) {
  ASSERT_EQ(std::distance(want.begin(), want.end()), std::distance(got.begin(), got.end())) << what;
  for (const auto& [name, m] : want) {
    ASSERT_TRUE(got.contains(name)) << what << " " << name;
    // Bitwise: EXPECT_EQ on doubles is exact.
    EXPECT_EQ(got.at(name).sum, m.sum) << what << " " << name;
    EXPECT_EQ(got.at(name).count, m.count) << what << " " << name;
  }
}

// What one run of a few steps leaves behind, to compare across devices.
struct TrainRun {
  TensorTree init;           // the initial parameters
  TensorTree grads;          // the first step's gradient (accumulate_gradients)
  double grad_loss = 0;      // and its loss
  std::vector<Metrics> steps;
  TrainState state;          // after the steps
};

// A few steps on the current device: everything (data, parameters) made there.
using Program = std::function<TrainRun()>;

void expect_same_on_checked(const Program& program) {
  TrainRun cpu, checked;
  {
    DeviceScope on(Device::cpu());
    cpu = program();
  }
  {
    DeviceScope on(kChecked);
    checked = program();
  }
  expect_bitwise_equal(cpu.init, checked.init, kChecked, "initial params");
  expect_bitwise_equal(cpu.grads, checked.grads, kChecked, "gradients");
  EXPECT_EQ(cpu.grad_loss, checked.grad_loss);
  ASSERT_EQ(cpu.steps.size(), checked.steps.size());
  for (std::size_t i = 0; i < cpu.steps.size(); ++i)
    expect_metrics_equal(cpu.steps[i], checked.steps[i], "step " + std::to_string(i));
  expect_bitwise_equal(cpu.state.params, checked.state.params, kChecked, "params");
  expect_bitwise_equal(cpu.state.opt_state, checked.state.opt_state, kChecked, "opt_state");
  EXPECT_EQ(cpu.state.step, checked.state.step);
}

TrainRun classifier_run() {
  const models::Classifier model({.in_features = 24, .hidden = 32, .num_classes = 5});
  const data::ArrayDataset d = data::synthetic_classification(64, 24, 5, Key::from_seed(3));
  const optim::AdamW opt({.learning_rate = optim::constant_schedule(3e-3)});
  const LossFn loss = [&](const TensorTree& p, const Batch& b, Key k) {
    return models::classification_loss(model.apply(p, b.inputs, /*train=*/true, k), b.labels);
  };
  TrainRun r;
  r.init = model.init(Key::from_seed(0));
  r.state = TrainState::create(r.init, opt, Key::from_seed(5));
  const Batch first = d.gather({3, 1, 4, 1, 5, 9, 2, 6, 53, 58, 9, 7, 32, 38, 46, 26});
  GradientResult g = accumulate_gradients(loss, r.init, first, Key::from_seed(7), 1);
  r.grads = g.grads;
  r.grad_loss = g.metrics.mean("loss");
  r.steps.push_back(train_step(r.state, first, loss, opt));
  r.steps.push_back(train_step(r.state, d.slice(16, 48), loss, opt, {.num_minibatches = 2}));
  return r;
}

TEST(CheckedTrain, ClassifierAdamWStepIsBitwiseEqualToTheCpu) {
  expect_same_on_checked(classifier_run);
}

TrainRun gpt_run() {
  const models::Transformer model({.vocab = 64,
                                   .d_model = 32,
                                   .num_layers = 2,
                                   .num_heads = 2,
                                   .max_len = 16,
                                   .learned_positions = false});
  std::vector<std::uint8_t> text(600);
  for (std::size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<std::uint8_t>((i * 7 + i / 13) % 64);
  const optim::AdamW opt(
      {.learning_rate = optim::constant_schedule(1e-2), .decay_mask = optim::default_decay_mask()});
  const LossFn loss = [&](const TensorTree& p, const Batch& b, Key k) {
    return std::make_pair(model.loss(nn::Scope::apply(&p, /*train=*/true, k), b.inputs, b.labels),
                          Metrics{});
  };
  TrainRun r;
  r.init = model.init(Key::from_seed(1));
  r.state = TrainState::create(r.init, opt, Key::from_seed(2));
  const Batch first = data::sample_windows(text, 4, 16, Key::from_seed(10));
  GradientResult g = accumulate_gradients(loss, r.init, first, Key::from_seed(3), 2);
  r.grads = g.grads;
  r.grad_loss = g.metrics.mean("loss");
  // A small max norm: clipping scales the gradient on every step.
  r.steps.push_back(train_step(r.state, first, loss, opt, {.max_grad_norm = 0.05}));
  const Batch second = data::sequential_windows(text, 4, 16, 1).at(0);
  r.steps.push_back(
      train_step(r.state, second, loss, opt, {.num_minibatches = 2, .max_grad_norm = 0.05}));
  return r;
}

TEST(CheckedTrain, GptAdamWClippedStepIsBitwiseEqualToTheCpu) {
  expect_same_on_checked(gpt_run);
}

// The GPT of gpt_run, its data and optimizer, for the host-wait tests below.
struct SmallGpt {
  models::Transformer model{{.vocab = 64,
                             .d_model = 32,
                             .num_layers = 2,
                             .num_heads = 2,
                             .max_len = 16,
                             .learned_positions = false}};
  std::vector<std::uint8_t> text = std::vector<std::uint8_t>(600);
  optim::AdamW opt{
      {.learning_rate = optim::constant_schedule(1e-2), .decay_mask = optim::default_decay_mask()}};
  LossFn loss = [this](const TensorTree& p, const Batch& b, Key k) {
    return std::make_pair(model.loss(nn::Scope::apply(&p, /*train=*/true, k), b.inputs, b.labels),
                          Metrics{});
  };
  SmallGpt() {
    for (std::size_t i = 0; i < text.size(); ++i)
      text[i] = static_cast<std::uint8_t>((i * 7 + i / 13) % 64);
  }
  Batch batch(int i) const { return data::sample_windows(text, 4, 16, Key::from_seed(10 + i)); }
};

// What a GPU needs to run a step without the host waiting on it: the loss, the gradient
// norm and the clip factor stay on the device, read only when a metric is.
TEST(CheckedTrain, StepsMakeNoHostWaitUntilTheMetricsAreRead) {
  DeviceScope on(kChecked);
  SmallGpt g;
  TrainState state = TrainState::create(g.model.init(Key::from_seed(1)), g.opt, Key::from_seed(2));
  const std::vector<Batch> batches = {g.batch(0), g.batch(1), g.batch(2)};
  const std::int64_t before = tensor::host_waits(DeviceKind::Checked);
  std::vector<Metrics> steps;
  steps.push_back(train_step(state, batches[0], g.loss, g.opt, {.max_grad_norm = 0.05}));
  steps.push_back(train_step(state, batches[1], g.loss, g.opt,
                             {.num_minibatches = 2, .max_grad_norm = 0.05}));
  steps.push_back(train_step(state, batches[2], g.loss, g.opt));  // no clipping
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked), before) << "a step waited for the device";
  Metrics window;
  for (const Metrics& m : steps) {
    EXPECT_TRUE(m.pending("loss"));
    EXPECT_TRUE(m.pending("grad_norm"));
    EXPECT_FALSE(m.pending("learning_rate"));
    window.merge(m);
  }
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked), before) << "merging read a metric";
  // Read now: the mean of the three steps' losses, each step's as it reads alone.
  const double mean = window.mean("loss");
  EXPECT_GT(tensor::host_waits(DeviceKind::Checked), before);
  EXPECT_FALSE(window.pending("loss"));
  EXPECT_TRUE(window.pending("grad_norm"));  // read one by one
  double sum = 0.0;
  for (const Metrics& m : steps) sum += m.at("loss").sum;
  EXPECT_EQ(window.at("loss").sum, sum);
  EXPECT_EQ(mean, sum / window.at("loss").count);
  EXPECT_GT(steps[0].mean("grad_norm"), 0.05);  // the clipping applied: the norm is above it
}

// A timeline times only the steps it keeps: the others make no host wait.
TEST(CheckedTrain, OnlyTheTimelinesStepsWaitForTheDevice) {
  const fs::path dir = fs::temp_directory_path() / ("distjax_checked_tl_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  DeviceScope on(kChecked);
  SmallGpt g;
  TrainState state = TrainState::create(g.model.init(Key::from_seed(1)), g.opt, Key::from_seed(2));
  Trainer trainer({.total_steps = 6, .log_every = 100, .print = false, .plot = false,
                   .timeline_file = (dir / "timeline.json").string(), .timeline_steps = 2},
                  g.opt, g.loss);
  const std::int64_t before = tensor::host_waits(DeviceKind::Checked);
  for (int s = 0; s < 4; ++s) trainer.step(state, g.batch(s));
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked), before) << "an untimed step waited";
  for (int s = 4; s < 6; ++s) trainer.step(state, g.batch(s));
  EXPECT_GT(tensor::host_waits(DeviceKind::Checked), before) << "the timed steps wait";
  trainer.finish(state);
  std::ifstream in(dir / "timeline.json");
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t updates = 0;
  for (std::size_t at = trace.find("\"update\""); at != std::string::npos;
       at = trace.find("\"update\"", at + 1))
    ++updates;
  EXPECT_EQ(updates, 2u) << trace;
  fs::remove_all(dir);
}

// On a device the Trainer checks a step's loss when it reads it (at the next log), and
// still names the step that went wrong.
TEST(CheckedTrain, TrainerReadsTheLossAtTheLogAndNamesTheBadStep) {
  DeviceScope on(kChecked);
  SmallGpt g;
  int calls = 0;
  const LossFn poisoned = [&](const TensorTree& p, const Batch& b, Key k) {
    auto [loss, m] = g.loss(p, b, k);
    // The loss of the second step is nan (so are its gradients).
    if (++calls == 2) loss = tensor::mul_scalar(loss, std::numeric_limits<double>::quiet_NaN());
    return std::make_pair(loss, m);
  };
  TrainState state = TrainState::create(g.model.init(Key::from_seed(1)), g.opt, Key::from_seed(2));
  Trainer trainer({.total_steps = 8, .log_every = 4, .print = false, .plot = false}, g.opt,
                  poisoned);
  const std::int64_t before = tensor::host_waits(DeviceKind::Checked);
  for (int s = 0; s < 3; ++s) trainer.step(state, g.batch(s));
  EXPECT_EQ(tensor::host_waits(DeviceKind::Checked), before) << "a step waited for the device";
  try {
    trainer.step(state, g.batch(3));  // step 4 logs: the window is read
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 2: the loss is nan"), std::string::npos) << what;
  }
  // Before a checkpoint the loop asks at once (check_finite), between two logs.
  calls = 0;
  TrainState again = TrainState::create(g.model.init(Key::from_seed(1)), g.opt, Key::from_seed(2));
  Trainer before_save({.total_steps = 8, .log_every = 4, .print = false, .plot = false}, g.opt,
                      poisoned);
  before_save.step(again, g.batch(0));
  before_save.check_finite();  // step 1 is fine
  before_save.step(again, g.batch(1));
  try {
    before_save.check_finite();
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 2: the loss is nan"), std::string::npos) << what;
  }
}

// The optimizers alone (no ops around them): SGD with and without momentum, Adam with L2,
// AdamW, then clipping, on hand-made leaves.
TEST(CheckedTrain, OptimizerUpdatesAreBitwiseEqualToTheCpu) {
  const std::vector<float> p0 = {0.5f, -1.f, 2.f, 0.25f, 3.f, -0.125f};
  const std::vector<float> g0 = {0.1f, -0.2f, 0.3f, 0.f, -7.f, 0.01f};
  const optim::SGD sgd({.learning_rate = optim::constant_schedule(0.1), .weight_decay = 1e-3});
  const optim::SGD heavy_ball({.learning_rate = optim::constant_schedule(0.1), .momentum = 0.9});
  const optim::SGD nesterov(
      {.learning_rate = optim::constant_schedule(0.1), .momentum = 0.9, .nesterov = true});
  const optim::Adam adam({.learning_rate = optim::constant_schedule(1e-2), .weight_decay = 1e-2});
  const optim::AdamW adamw({.learning_rate = optim::constant_schedule(1e-2)});
  for (const optim::Optimizer* opt :
       std::vector<const optim::Optimizer*>{&sgd, &heavy_ball, &nesterov, &adam, &adamw}) {
    auto run = [&](Device device) {
      DeviceScope on(device);
      TensorTree params, grads;
      params.set("w", Tensor::from_vector(p0, {2, 3}));
      params.set("ids", Tensor::from_vector<std::int32_t>({1, 2}, {2}));  // not trainable
      grads.set("w", Tensor::from_vector(g0, {2, 3}));
      TensorTree state = opt->init(params);
      for (int s = 0; s < 3; ++s)
        opt->update(params, grads, state, s);
      const double norm = optim::clip_by_global_norm(grads, 1.0);
      return std::make_tuple(params, state, grads, norm);
    };
    const auto [p_cpu, s_cpu, g_cpu, n_cpu] = run(Device::cpu());
    const auto [p_chk, s_chk, g_chk, n_chk] = run(kChecked);
    expect_bitwise_equal(p_cpu, p_chk, kChecked, "params");
    expect_bitwise_equal(s_cpu, s_chk, kChecked, "state");
    expect_bitwise_equal(g_cpu, g_chk, kChecked, "clipped grads");
    EXPECT_EQ(n_cpu, n_chk);
  }
}

TEST(CheckedTrain, UpdateOpsRefuseMixedDevices) {
  Tensor p = Tensor::ones({4}, DType::F32, kChecked);
  Tensor m = Tensor::zeros({4}, DType::F32, kChecked), v = Tensor::zeros({4}, DType::F32, kChecked);
  const Tensor g = Tensor::ones({4}, DType::F32, Device::cpu());
  try {
    tensor::adam_update_(p, g, m, v, {});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[adam_update_]"), std::string::npos) << what;
    EXPECT_NE(what.find("checked:0"), std::string::npos) << what;
  }
  EXPECT_EQ(p.to_vector<float>(), std::vector<float>(4, 1.f));  // untouched
}

// A state trained a few steps by hand (initializers and the optimizer only, no model), on
// the current device.
TrainState hand_trained(std::uint64_t seed, int steps) {
  TensorTree params;
  params.set("fc/kernel", nn::lecun_normal()(Key::from_seed(seed), {24, 32}));
  params.set("fc/bias", nn::zeros()(Key::from_seed(seed), {32}));
  params.set("ids", Tensor::from_vector<std::int32_t>({4, 5, 6}, {3}));  // not trainable
  const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2)});
  TrainState state = TrainState::create(params, opt, Key::from_seed(seed + 1));
  for (int s = 0; s < steps; ++s) {
    TensorTree grads;
    grads.set("fc/kernel", nn::normal(0.1)(Key::from_seed(100 + s), {24, 32}));
    grads.set("fc/bias", nn::constant(0.5 - s)(Key(), {32}));
    opt.update(state.params, grads, state.opt_state, state.step);
    state.step += 1;
  }
  return state;
}

TEST(CheckedTrain, CheckpointSaveAndLoadOnTheCheckedDevice) {
  const fs::path dir =
      fs::temp_directory_path() / ("distjax_checked_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainState cpu;
  {
    DeviceScope on(Device::cpu());
    cpu = hand_trained(0, 3);
    save_checkpoint((dir / "cpu").string(), cpu, {});
  }
  DeviceScope on(kChecked);
  const TrainState a = hand_trained(0, 3);
  expect_bitwise_equal(cpu.params, a.params, kChecked, "trained params");
  save_checkpoint((dir / "checked").string(), a, {});
  // Loaded on the checked device into a state of other values: the saved ones come back,
  // on the checked device, bitwise.
  TrainState b = hand_trained(9, 1);
  load_checkpoint((dir / "checked").string(), b, {});
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(b.rng, a.rng);
  expect_bitwise_equal(a.params, b.params, kChecked, "loaded params");
  expect_bitwise_equal(a.opt_state, b.opt_state, kChecked, "loaded opt_state");
  // The CPU's checkpoint holds the same bytes, and loads on the checked device to them.
  TrainState c = hand_trained(9, 1);
  load_checkpoint((dir / "cpu").string(), c, {});
  expect_bitwise_equal(cpu.params, c.params, kChecked, "params from the CPU's checkpoint");
  expect_bitwise_equal(cpu.opt_state, c.opt_state, kChecked,
                       "opt_state from the CPU's checkpoint");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distjax::train
