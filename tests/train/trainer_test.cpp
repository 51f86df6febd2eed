#include "distjax/train/trainer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "distjax/data/loader.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/checkpointer.hpp"

namespace distjax::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::pair<Tensor, Metrics> loss_fn(const TensorTree& p, const Batch& b, Key) {
  Tensor logits = tensor::linear(b.inputs, p.at("w"), p.at("b"));
  return {tensor::mean(tensor::cross_entropy(logits, b.labels)), Metrics{}};
}

TEST(Trainer, WritesTheDeviceTimelineOfItsLastSteps) {
  const fs::path file = fs::temp_directory_path() / "distjax_trainer_timeline" / "timeline_device3.json";
  fs::remove_all(file.parent_path());
  data::ArrayDataset d = data::synthetic_classification(64, 6, 3, Key::from_seed(1));
  data::DataLoader loader(d, {.batch_size = 16, .seed = 3});
  optim::AdamW opt({.learning_rate = optim::constant_schedule(0.01)});
  TensorTree params;
  params.set("w", Tensor::zeros({6, 3}));
  params.set("b", Tensor::zeros({3}));
  TrainState state = TrainState::create(params, opt, Key::from_seed(0));
  Trainer trainer({.print = false, .plot = false, .timeline_file = file.string(), .device = 3,
                   .timeline_steps = 3},
                  opt, loss_fn);
  for (int s = 0; s < 5; ++s)
    trainer.step(state, loader.next());
  trainer.finish(state);
  const json trace = json::parse(std::ifstream(file));
  std::map<std::string, int> names;
  double last_end = 0;
  for (const json& e : trace["traceEvents"]) {
    ++names[e["name"].get<std::string>()];
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "X") {
      EXPECT_GE(e["ts"].get<double>() + 1e-6, last_end);  // in order, not overlapping
      last_end = e["ts"].get<double>() + e["dur"].get<double>();
    }
  }
  // The last 3 steps: each a forward + backward and an update; the sync may take no time.
  EXPECT_EQ(names["forward + backward"], 3);
  EXPECT_EQ(names["update"], 3);
  EXPECT_EQ(names["process_name"], 1);
  EXPECT_LE(names["gradient sync"], 3);
  fs::remove_all(file.parent_path());
}

TEST(Trainer, WritesMetricsJsonlAndSummary) {
  const fs::path dir = fs::temp_directory_path() / "distjax_trainer_test";
  fs::remove_all(dir);
  data::ArrayDataset d = data::synthetic_classification(64, 6, 3, Key::from_seed(1));
  data::DataLoader loader(d, {.batch_size = 16, .seed = 3});
  optim::AdamW opt({.learning_rate = optim::linear_schedule(0.0, 0.04, 4)});
  TensorTree params;
  params.set("w", Tensor::zeros({6, 3}));
  params.set("b", Tensor::zeros({3}));
  TrainState state = TrainState::create(params, opt, Key::from_seed(0));

  Trainer trainer({.out_dir = dir.string(), .total_steps = 5, .log_every = 2, .print = false}, opt,
                  loss_fn);
  for (int s = 0; s < 5; ++s)
    trainer.step(state, loader.next());
  Metrics eval = trainer.evaluate(state, d.batches(32));
  EXPECT_DOUBLE_EQ(eval.at("loss").count, 64.0);
  trainer.finish(state, {{"test_accuracy", 0.5}});

  std::ifstream f(dir / "metrics.jsonl");
  std::vector<json> lines;
  for (std::string line; std::getline(f, line);)
    lines.push_back(json::parse(line));
  // Train records at steps 2, 4, 5 (the last), then one eval record.
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["step"], 2);
  EXPECT_EQ(lines[1]["step"], 4);
  EXPECT_EQ(lines[2]["step"], 5);
  // The learning rate of the logged step's update (updates 1, 3, 4 of 0..4).
  const double lr_logged[] = {0.01, 0.03, 0.04};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(lines[i]["loss"].is_number());
    EXPECT_DOUBLE_EQ(lines[i]["learning_rate"].get<double>(), lr_logged[i]);
    EXPECT_GT(lines[i]["throughput"].get<double>(), 0.0);
    EXPECT_EQ(lines[i]["throughput_unit"], "examples/s");
  }
  // From zero weights the loss starts at log(3) and goes down.
  EXPECT_LT(lines[1]["loss"].get<double>(), std::log(3.0));
  EXPECT_NEAR(lines[3]["eval_loss"].get<double>(), eval.mean("loss"), 1e-12);

  std::ifstream sf(dir / "summary.json");
  json s = json::parse(sf);
  EXPECT_EQ(s["steps"], 5);
  EXPECT_EQ(s["mesh"], "single device");
  EXPECT_EQ(s["backend"], "none");
  EXPECT_EQ(s["optimizer"], "adamw");
  EXPECT_EQ(s["num_parameters"], 21);
  EXPECT_DOUBLE_EQ(s["examples_seen"].get<double>(), 80.0);
  EXPECT_GT(s["wall_time_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(s["test_accuracy"].get<double>(), 0.5);
  EXPECT_NEAR(s["final_metrics"]["eval_loss"].get<double>(), eval.mean("loss"), 1e-12);
  EXPECT_TRUE(s["final_metrics"].contains("train_loss"));
  fs::remove_all(dir);
}

TEST(Trainer, BadOutputDirectoryIsAnIoError) {
  optim::AdamW opt({});
  EXPECT_THROW(Trainer({.out_dir = "/proc/distjax_cannot_write_here"}, opt, loss_fn), IoError);
}

// A linear classifier on a synthetic set at the start of training: the loader, a
// constant-rate AdamW and the state (the non-finite and resume tests).
struct Linear {
  data::ArrayDataset data = data::synthetic_classification(64, 6, 3, Key::from_seed(1));
  data::DataLoader loader{data, {.batch_size = 16, .seed = 3}};
  optim::AdamW opt{{.learning_rate = optim::constant_schedule(0.01)}};
  TrainState state = TrainState::create(
      [] {
        TensorTree p;
        p.set("w", Tensor::zeros({6, 3}));
        p.set("b", Tensor::zeros({3}));
        return p;
      }(),
      opt, Key::from_seed(0));
};

// A loss that turns NaN at step `bad` (and stays finite before): the run stops there with
// an error naming the step, and the latest checkpoint is the step before.
TEST(Trainer, NonFiniteLossStopsTheRunAtItsStep) {
  const fs::path dir = fs::temp_directory_path() / "distjax_trainer_nan";
  fs::remove_all(dir);
  Linear run;
  optim::AdamW& opt = run.opt;
  TrainState& state = run.state;
  data::DataLoader& loader = run.loader;
  constexpr std::int64_t bad = 4;  // the 4th step (state.step 3 -> 4) goes wrong
  const LossFn nan_at_bad = [&](const TensorTree& p, const Batch& b, Key k) {
    auto [loss, m] = loss_fn(p, b, k);
    if (state.step + 1 == bad) loss = tensor::mul_scalar(loss, std::nan(""));
    return std::make_pair(loss, m);
  };
  Trainer trainer({.out_dir = dir.string(), .log_every = 1, .print = false, .plot = false}, opt,
                  nan_at_bad);
  Checkpointer ckpt({.dir = (dir / "checkpoints").string(), .every = 1}, {});
  std::string error;
  try {
    while (state.step < 10) {
      trainer.step(state, loader.next());
      ckpt.maybe_save(state, {});
    }
  } catch (const NonFiniteError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("step 4: the loss is nan"), std::string::npos) << error;
  EXPECT_EQ(state.step, bad);  // stopped there
  const std::optional<std::string> latest = find_checkpoint((dir / "checkpoints").string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step_00000003");
  fs::remove_all(dir);
}

// The gradient norm alone can overflow (the loss stays finite): that stops the run too.
TEST(Trainer, NonFiniteGradientNormStopsTheRun) {
  Linear run;
  optim::AdamW& opt = run.opt;
  TrainState& state = run.state;
  data::DataLoader& loader = run.loader;
  // loss + sum(b) x 1e38 x 1e38 with b = 0: the value is the loss, the gradient of "b"
  // overflows f32 (1e76).
  const LossFn inf_grad = [](const TensorTree& p, const Batch& b, Key k) {
    auto [loss, m] = loss_fn(p, b, k);
    Tensor zero = tensor::mul_scalar(tensor::mul_scalar(tensor::sum(p.at("b")), 1e38), 1e38);
    return std::make_pair(tensor::add(loss, zero), m);
  };
  Trainer trainer({.print = false, .plot = false}, opt, inf_grad);
  try {
    trainer.step(state, loader.next());
    ADD_FAILURE() << "a NaN gradient norm did not stop the run";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: the gradient norm is"), std::string::npos)
        << e.what();
  }
}

// A resumed run (append) drops the records an interrupted run wrote past the step it
// resumes from: every step is in metrics.jsonl once.
TEST(Trainer, ResumedRunDropsTheRecordsPastItsStep) {
  const fs::path dir = fs::temp_directory_path() / "distjax_trainer_resume_log";
  fs::remove_all(dir);
  Linear run;
  optim::AdamW& opt = run.opt;
  TrainState& state = run.state;
  data::DataLoader& loader = run.loader;
  {
    Trainer first({.out_dir = dir.string(), .log_every = 1, .print = false, .plot = false}, opt,
                  loss_fn);
    for (int s = 0; s < 6; ++s)
      first.step(state, loader.next());
    first.log_eval(6, Metrics{});
  }
  {
    std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 7, \"lo";  // cut by a kill
  }
  state.step = 3;  // as if restored from the step-3 checkpoint
  Trainer resumed(
      {.out_dir = dir.string(), .log_every = 1, .print = false, .plot = false, .append = true}, opt,
      loss_fn);
  while (state.step < 8)
    resumed.step(state, loader.next());
  resumed.finish(state);
  std::map<std::int64_t, int> train_records;
  int eval_records = 0;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const json rec = json::parse(line);  // every line whole
    if (rec.contains("loss")) ++train_records[rec["step"].get<std::int64_t>()];
    if (rec.contains("elapsed_s") && !rec.contains("loss")) ++eval_records;
  }
  for (std::int64_t step = 1; step <= 8; ++step)
    EXPECT_EQ(train_records[step], 1) << "step " << step;
  EXPECT_EQ(train_records.size(), 8u);
  EXPECT_EQ(eval_records, 0);  // the eval at step 6 was past the resumed step
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distjax::train
