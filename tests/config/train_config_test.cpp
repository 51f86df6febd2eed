// TrainConfig's own rules (the distributed ones are in distributed_config_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "distjax/config/train_config.hpp"
#include "distjax/core/error.hpp"

using namespace distjax;
using config::Shard;
using config::TrainConfig;

namespace {

// Valid: the classifier on a ("data"=2) mesh of threads.
TrainConfig valid() {
  TrainConfig c;
  c.run.program = "train_mnist";
  c.run.steps = 10;
  c.distributed.world_size = 2;
  c.distributed.num_processes_per_node = 2;
  c.distributed.backend = config::BackendChoice::Threads;
  return c;
}

std::string problems(const TrainConfig& c) {
  std::string out;
  for (const std::string& p : c.problems())
    out += p + "\n";
  return out;
}

#define EXPECT_PROBLEM(config, text)                                                               \
  do {                                                                                             \
    const std::string all_ = problems(config);                                                     \
    EXPECT_NE(all_.find(text), std::string::npos) << "expected: " << (text) << "\ngot:\n" << all_; \
  } while (0)

}  // namespace

TEST(TrainConfig, ValidHasNoProblems) {
  EXPECT_TRUE(valid().problems().empty()) << problems(valid());
}

TEST(TrainConfig, EveryRuleGivesItsMessage) {
  TrainConfig c = valid();
  c.run.batch_size = 0;
  EXPECT_PROBLEM(c, "run.batch_size = 0 must be positive");
  c = valid();
  c.model.heads = -1;
  EXPECT_PROBLEM(c, "model.heads = -1 must be positive");
  c = valid();
  c.run.steps = -3;
  EXPECT_PROBLEM(c, "run.steps = -3 must not be negative");
  c = valid();
  c.run.program = "";
  EXPECT_PROBLEM(c, "run.program is not set");
  c = valid();
  c.run.steps = 0;
  EXPECT_PROBLEM(c, "run.steps and run.epochs are both 0");
  c = valid();
  c.optimizer.lr = 0;
  EXPECT_PROBLEM(c, "optimizer.lr = 0 must be positive");
  c = valid();
  c.model.dropout = 1.0;
  EXPECT_PROBLEM(c, "model.dropout = 1 must be in [0, 1)");
  c = valid();
  c.data.validation_fraction = 0;
  EXPECT_PROBLEM(c, "data.validation_fraction = 0 must be in (0, 1)");
  c = valid();
  c.run.batch_size = 127;
  EXPECT_PROBLEM(c, "run.batch_size = 127 must be divisible by the data-parallel size 2");
  c = valid();
  c.run.grad_accum_steps = 3;
  EXPECT_PROBLEM(c,
                 "run.batch_size / data-parallel size = 64 must be divisible by "
                 "run.grad_accum_steps = 3");
  c = valid();
  c.distributed.rank = 5;
  EXPECT_PROBLEM(c, "distributed: rank = 5 must be below world_size = 2");
  c = valid();
  c.parallelism.virtual_stages = 2;
  c.parallelism.schedule = "zbh1";
  EXPECT_PROBLEM(c, "parallelism.virtual_stages = 2 needs parallelism.schedule = \"interleaved\" "
                    "or \"interleaved_zb\" (got \"zbh1\")");
  c.parallelism.schedule = "interleaved_zb";
  EXPECT_TRUE(c.problems().empty()) << problems(c);
}

// Values that cannot train: NaN or infinite numbers set in code (the file and --set refuse
// them while parsing), an Adam epsilon of 0, a negative clip norm.
TEST(TrainConfig, ValuesThatCannotTrainAreProblems) {
  TrainConfig c = valid();
  c.optimizer.lr = std::nan("");
  c.optimizer.final_lr_ratio = std::numeric_limits<double>::infinity();
  c.optimizer.eps = 0;
  c.optimizer.max_grad_norm = -1;
  c.optimizer.b2 = 1.0;
  EXPECT_PROBLEM(c, "optimizer.lr = nan must be a finite number");
  EXPECT_PROBLEM(c, "optimizer.final_lr_ratio = inf must be a finite number");
  EXPECT_PROBLEM(c, "optimizer.eps = 0 must be positive");
  EXPECT_PROBLEM(c, "optimizer.max_grad_norm = -1 must not be negative");
  EXPECT_PROBLEM(c, "optimizer.b2 = 1 must be in [0, 1)");
}

// parallelism.microbatches splits a replica's batch only under a pipeline: a data-parallel
// run whose batch it does not divide is fine; a pipelined one is not.
TEST(TrainConfig, MicrobatchesAreCheckedOnlyUnderAPipeline) {
  TrainConfig c = valid();
  c.run.batch_size = 6;  // 3 per replica
  c.parallelism.microbatches = 4;
  EXPECT_EQ(problems(c), "");
  c.distributed.world_size = 4;
  c.distributed.num_processes_per_node = 4;
  c.distributed.pipeline_parallel_size = 2;
  EXPECT_PROBLEM(c, "must be divisible by parallelism.microbatches = 4");
}

TEST(TrainConfig, CheckpointKeysAreChecked) {
  TrainConfig c = valid();
  c.run.overwrite = true;
  c.run.resume = config::Resume::Auto;
  EXPECT_PROBLEM(c, "run.overwrite = true and run.resume exclude each other");
  c = valid();
  c.run.resume_drop = {"lm_head/*"};
  EXPECT_PROBLEM(c, "run.resume_drop is set but run.resume = false");
  c.run.resume = config::Resume::Required;
  EXPECT_TRUE(c.problems().empty()) << problems(c);
  c.run.resume_drop = {"lm_head/*", ""};
  EXPECT_PROBLEM(c, "run.resume_drop item \"\" must be a non-empty glob");
  c = valid();
  c.run.out_dir = "";
  c.run.checkpoint_every = 10;
  EXPECT_PROBLEM(c, "run.out_dir is empty: checkpoints (run.checkpoint_every, run.resume) need it");
}

TEST(TrainConfig, PackedDocumentsNeedAnEot) {
  TrainConfig c = valid();
  c.data.document_attention = true;
  EXPECT_PROBLEM(c, "data.document_attention = true needs data.eot");
  c.data.eot = 50256;
  EXPECT_TRUE(c.problems().empty()) << problems(c);
  c.data.eot = -2;
  EXPECT_PROBLEM(c, "data.eot = -2 must be a token id, or -1 for none");
  // Through a pipeline too: every stage has the micro-batch's document ids.
  c.data.eot = 0;
  c.distributed.pipeline_parallel_size = 2;
  EXPECT_TRUE(c.problems().empty()) << problems(c);
}

TEST(TrainConfig, ValidateThrowsOneErrorListingAll) {
  TrainConfig c = valid();
  c.run.batch_size = 127;
  c.optimizer.lr = -1;
  try {
    c.validate("configs/a.toml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[config] configs/a.toml: 2 problems:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("  - optimizer.lr = -1 must be positive"), std::string::npos) << msg;
  }
}
