// ProgramCapabilities: a config asking for more than a program runs gets one message per key,
// and one within them none.
#include "distjax/config/program_capabilities.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace distjax;
using config::ProgramCapabilities;
using config::Shard;
using config::TrainConfig;

namespace {

std::string problems(const ProgramCapabilities& runs, const TrainConfig& c) {
  std::string out;
  for (const std::string& p : runs.problems(c))
    out += p + "\n";
  return out;
}

// A GPT program's: tensor, pipe, FSDP, bf16 and fp16, fp16 not with a pipe (a program that
// does not give its pipeline its loss function); no ZeRO.
const ProgramCapabilities kGpt{.tensor_parallel = true,
                               .pipeline_parallel = true,
                               .shards = {Shard::None, Shard::Parameters},
                               .mixed_precision = true};

}  // namespace

TEST(ProgramCapabilities, WithinThemNoProblem) {
  TrainConfig c;
  c.distributed.world_size = 8;
  c.distributed.tensor_parallel_size = 2;
  c.distributed.pipeline_parallel_size = 2;
  c.parallelism.shard = Shard::Parameters;
  c.distributed.mixed_precision = config::MixedPrecision::Bf16;
  EXPECT_EQ(problems(kGpt, c), "");
  // A "context" axis: named unless the program splits sequences.
  c.distributed.context_parallel_size = 2;
  EXPECT_NE(problems(kGpt, c).find("distributed.context_parallel_size = 2"), std::string::npos);
  ProgramCapabilities with_context = kGpt;
  with_context.context_parallel = true;
  EXPECT_EQ(problems(with_context, c), "");
  EXPECT_EQ(with_context.str(),
            "mesh axes data, model, pipe, context; DP, FSDP; f32, bf16, fp16 (fp16 not with pipe)");
}

// An explicit mesh axis of size > 1 that no strategy of the program uses is named; one of
// size 1, or one the program uses, is not.
TEST(ProgramCapabilities, AnIdleMeshAxisIsNamed) {
  TrainConfig c;
  c.distributed.mesh_shape = {2, 2, 2};
  c.distributed.mesh_axis_names = {"data", "model", "extra"};
  EXPECT_EQ(problems(kGpt, c),
            "mesh axis \"extra\" (size 2) is used by no strategy of this program, which splits "
            "work over [\"data\", \"model\", \"pipe\"] only: the 2 devices along it would "
            "compute the same thing. Remove it from distributed.mesh_axis_names / mesh_shape (or "
            "give it size 1), or fold its size into one of those axes\n");
  c.distributed.mesh_shape = {4, 2, 1};
  EXPECT_EQ(problems(kGpt, c), "");
  c.distributed.mesh_shape = {4, 2};
  c.distributed.mesh_axis_names = {"data", "model"};
  EXPECT_NE(problems(ProgramCapabilities{}, c).find("mesh axis \"model\" (size 2)"),
            std::string::npos);
}

TEST(ProgramCapabilities, EveryKeyBeyondThemIsNamed) {
  TrainConfig c;
  c.parallelism.shard = Shard::Optimizer;
  EXPECT_EQ(problems(kGpt, c),
            "parallelism.shard = \"optimizer\" is not implemented for this program (it runs "
            "shard = \"none\", \"parameters\")\n");
  c = TrainConfig{};
  c.distributed.mixed_precision = config::MixedPrecision::Fp16;
  c.distributed.pipeline_parallel_size = 2;
  EXPECT_NE(problems(kGpt, c).find("\"fp16\" with pipeline_parallel_size = 2"), std::string::npos);
  // A classifier on ("data"): every key beyond it, one message each.
  c = TrainConfig{};
  c.distributed.world_size = 8;
  c.distributed.tensor_parallel_size = 2;
  c.distributed.pipeline_parallel_size = 2;
  c.parallelism.shard = Shard::Parameters;
  c.distributed.mixed_precision = config::MixedPrecision::Bf16;
  c.distributed.context_parallel_size = 2;
  const std::string all = problems(ProgramCapabilities{.max_devices = 4}, c);
  for (const char* key :
       {"distributed.world_size = 8: this program runs on at most 4 devices",
        "distributed.tensor_parallel_size = 2: this program has no tensor parallelism",
        "distributed.pipeline_parallel_size = 2: this program has no pipeline",
        "distributed.context_parallel_size = 2: this program has no context parallelism",
        "parallelism.shard = \"parameters\" is not implemented for this program",
        "distributed.mixed_precision = \"bf16\" is not implemented for this program"})
    EXPECT_NE(all.find(key), std::string::npos) << key << "\n" << all;
}

TEST(ProgramCapabilities, Fp16LeavesNoPipelineUnlessItRunsOne) {
  config::TrainConfig c;
  c.model.tie_embeddings = false;
  c.distributed.mixed_precision = config::MixedPrecision::Fp16;
  EXPECT_FALSE(kGpt.for_config(c).pipeline_parallel);
  ProgramCapabilities scaled = kGpt;
  scaled.fp16_pipeline = true;
  EXPECT_TRUE(scaled.for_config(c).pipeline_parallel);
  c.distributed.mixed_precision = config::MixedPrecision::Bf16;
  EXPECT_TRUE(kGpt.for_config(c).pipeline_parallel);
  // A tied GPT runs no pipeline: the planner suggests none, the program refuses one.
  ProgramCapabilities tying = kGpt;
  tying.ties_embeddings = true;
  EXPECT_TRUE(tying.for_config(c).pipeline_parallel);
  c.model.tie_embeddings = true;
  EXPECT_FALSE(tying.for_config(c).pipeline_parallel);
  c.distributed.pipeline_parallel_size = 2;
  const std::vector<std::string> p = tying.problems(c);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("model.tie_embeddings = true with pipeline_parallel_size = 2"),
            std::string::npos)
      << p[0];
  EXPECT_EQ(kGpt.str(),
            "mesh axes data, model, pipe; DP, FSDP; f32, bf16, fp16 (fp16 not with pipe)");
  const ProgramCapabilities zero{.shards = {Shard::None, Shard::Optimizer, Shard::Gradients}};
  EXPECT_EQ(zero.str(), "mesh axes data; DP, ZeRO-1, ZeRO-2; f32");
}
