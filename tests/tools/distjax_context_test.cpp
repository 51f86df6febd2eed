// `distjax train` with the GPT's sequences split over a "context" axis, end to end through
// the composition: on every mesh (context alone, ring balanced and plain, Ulysses, with a
// pipeline, with data and tensor parallelism and sequence parallelism, with fully sharded
// parameters) the losses of 6 AdamW steps are the one-device run's; a checkpoint saved on
// one context size resumes on another; bad settings are refused naming their keys before
// any step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/tool_run.hpp"

namespace fs = std::filesystem;

namespace {

// Losses of 6 AdamW steps on the fortunes GPT, each device's f32 sums in another order:
// measured within 1.5e-7 relative of one device on every mesh here.
constexpr double kTol = 1e-6;

fs::path fresh(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("distjax_cp_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p;
}

// `distjax train configs/gpt_3d.toml` shrunk to 6 steps of a 2-block GPT, on `world` devices
// split as `mesh` says (--set overrides), into `out`.
std::string train(const fs::path& out, int world, const std::string& mesh,
                  const std::string& more = "") {
  return std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
         "/configs/gpt_3d.toml --set run.steps=6 --set run.log_every=1 --set run.eval_every=0 "
         "--set run.eval_batches=1 --set run.timeline=false --set model.layers=2 "
         "--set distributed.world_size=" +
         std::to_string(world) +
         " --set distributed.tensor_parallel_size=1 --set distributed.pipeline_parallel_size=1 " +
         mesh + " " + more + " --out " + out.string();
}

// step -> logged train loss.
std::map<int, double> losses(const fs::path& out) {
  return distjax::testing::train_losses(out);
}

void expect_same_losses(const std::map<int, double>& want, const std::map<int, double>& got,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": no loss at step " << step;
    EXPECT_NEAR(got.at(step), loss, kTol * loss) << what << ", step " << step;
  }
}

const std::map<int, double>& one_device() {
  static const std::map<int, double> want = [] {
    const fs::path out = fresh("one");
    const auto [status, output] =
        distjax::testing::run_tool(train(out, 1, "", "--set run.checkpoint_every=0"));
    EXPECT_EQ(status, 0) << output;
    auto l = losses(out);
    EXPECT_EQ(l.size(), 6u) << output;
    fs::remove_all(out);
    return l;
  }();
  return want;
}

}  // namespace

TEST(DistjaxContext, EveryMeshTrainsAsOneDevice) {
  const std::map<int, double>& want = one_device();
  struct Mesh {
    std::string name;
    int world;
    std::string sets;
  };
  const std::vector<Mesh> meshes = {
      {"ring cp=4", 4, "--set distributed.context_parallel_size=4"},
      {"ring plain cp=4", 4,
       "--set distributed.context_parallel_size=4 --set parallelism.context_balance=false"},
      {"ulysses cp=2", 2,
       "--set distributed.context_parallel_size=2 --set parallelism.context_parallel_method=ulysses"},
      {"cp=2 x pipe=2", 4,
       "--set distributed.context_parallel_size=2 --set distributed.pipeline_parallel_size=2"},
      {"data=2 x cp=2 x tp=2 sp", 8,
       "--set distributed.context_parallel_size=2 --set distributed.tensor_parallel_size=2 "
       "--set parallelism.sequence_parallel=true"},
      {"fsdp data=2 x cp=2", 4,
       "--set distributed.context_parallel_size=2 --set parallelism.shard=parameters "
       "--set parallelism.fsdp.min_weight_size=1"},
  };
  for (const Mesh& m : meshes) {
    const fs::path out = fresh("mesh");
    const auto [status, output] =
        distjax::testing::run_tool(train(out, m.world, m.sets, "--set run.checkpoint_every=0"));
    ASSERT_EQ(status, 0) << m.name << "\n" << output;
    expect_same_losses(want, losses(out), m.name);
    fs::remove_all(out);
  }
}

// The parameters are replicated over "context": a checkpoint saved with the sequence split
// in 2 resumes with it split in 4, or not split, and goes on as the run that saved it.
TEST(DistjaxContext, ACheckpointResumesOnAnotherContextSize) {
  const fs::path base = fresh("resume");
  const auto [status, output] = distjax::testing::run_tool(
      train(base / "cp2", 2, "--set distributed.context_parallel_size=2",
            "--set run.checkpoint_every=4"));
  ASSERT_EQ(status, 0) << output;
  const std::map<int, double> want = losses(base / "cp2");
  ASSERT_EQ(want.size(), 6u) << output;
  auto resume_on = [](int world, int cp) {
    return [world, cp](const fs::path& out) {
      return train(out, world, "--set distributed.context_parallel_size=" + std::to_string(cp),
                   "--set run.checkpoint_every=0 --resume");
    };
  };
  distjax::testing::expect_resumes_as_saved(base / "cp2", want,
                                            {{"cp4", resume_on(4, 4)}, {"cp1", resume_on(1, 1)}},
                                            kTol);
  fs::remove_all(base);
}

TEST(DistjaxContext, BadSettingsAreRefusedNamingTheKeys) {
  const fs::path out = fresh("bad");
  const auto refused = [&](const std::string& command, const std::vector<std::string>& words) {
    const auto [status, output] = distjax::testing::run_tool(command);
    EXPECT_NE(status, 0) << command << "\n" << output;
    EXPECT_EQ(output.find("step 1/"), std::string::npos) << "a step ran: " << output;
    for (const std::string& w : words)
      EXPECT_NE(output.find(w), std::string::npos) << "no \"" << w << "\" in:\n" << output;
  };
  // 60 positions do not split into 8 balanced chunks.
  refused(train(out, 4, "--set distributed.context_parallel_size=4", "--set data.seq_len=60"),
          {"data.seq_len = 60", "distributed.context_parallel_size = 4",
           "parallelism.context_balance"});
  // Ulysses splits each device's heads: 4 heads over 8 devices.
  refused(train(out, 8,
                "--set distributed.context_parallel_size=8 "
                "--set parallelism.context_parallel_method=ulysses"),
          {"parallelism.context_parallel_method = \"ulysses\"", "model.heads = 4",
           "distributed.context_parallel_size = 8"});
  refused(train(out, 2,
                "--set distributed.context_parallel_size=2 "
                "--set parallelism.context_parallel_method=rings"),
          {"parallelism.context_parallel_method", "rings", "ring", "ulysses"});
  refused(train(out, 2, "--set distributed.context_parallel_size=2",
                "--set data.eot=10 --set data.document_attention=true"),
          {"data.document_attention", "distributed.context_parallel_size = 2"});
  // A model without attention has no sequence to split.
  refused(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
              "/configs/train_mnist.toml --set distributed.world_size=2 "
              "--set distributed.context_parallel_size=2 --out " + out.string(),
          {"distributed.context_parallel_size = 2", "no context parallelism"});
  // world_size must hold the context axis.
  refused(train(out, 3, "--set distributed.context_parallel_size=2"),
          {"context_parallel_size = 1 x 1 x 2 = 2 must divide world_size = 3"});
  fs::remove_all(out);
}
