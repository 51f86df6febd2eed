#include "distjax/train/trainer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "distjax/data/loader.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

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

}  // namespace
}  // namespace distjax::train
