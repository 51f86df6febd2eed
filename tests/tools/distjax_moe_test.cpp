// `distjax train` with Mixture-of-Experts blocks ([model.moe]), end to end through the
// composition: dropless, on every mesh here the losses of 6 AdamW steps are the one-device
// run's: data parallel, ZeRO-1/2, fully sharded; experts split over an "expert" axis of 2,
// 4 and 8 devices, alone and beside data parallelism, ZeRO-1/2 and fully sharded
// parameters, tensor and sequence parallelism and a context split; the experts' hidden
// width (and a shared expert's) split over "model", with and without sequence parallelism;
// the exchange in overlapped chunks and the all-gather dispatcher. The balancing statistics
// reach metrics.jsonl; bad settings are refused naming their keys before any step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "tools/tool_run.hpp"

namespace fs = std::filesystem;

namespace {

// Losses of 6 AdamW steps of the MoE GPT: each device's f32 sums in another order.
constexpr double kTol = 1e-6;

fs::path fresh(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("distjax_moe_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p;
}

// configs/gpt_moe.toml shrunk to 6 steps of a 2-block GPT with 8 experts in each block, on
// `world` devices split as `mesh` says. The balancing loss is a statistic of each device's
// tokens (as in Megatron), so a parity run leaves it out of the objective; the z-loss, a mean
// over tokens, stays in.
std::string train(const fs::path& out, int world, const std::string& mesh,
                  const std::string& more = "") {
  return std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
         "/configs/gpt_moe.toml --set run.steps=6 --set run.log_every=1 --set run.eval_every=0 "
         "--set run.eval_batches=1 --set model.layers=2 "
         "--set model.moe.experts=8 --set model.moe.aux_loss_coef=0 "
         "--set distributed.expert_parallel_size=1 "
         "--set distributed.world_size=" +
         std::to_string(world) + " " + mesh + " " + more + " --out " + out.string();
}

std::vector<nlohmann::json> records(const fs::path& out) {
  std::vector<nlohmann::json> got;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) got.push_back(nlohmann::json::parse(line));
  return got;
}

// step -> logged train loss.
std::map<int, double> losses(const fs::path& out) {
  return distjax::testing::train_losses(out);
}

const std::map<int, double>& one_device() {
  static const std::map<int, double> want = [] {
    const fs::path out = fresh("one");
    const auto [status, output] =
        distjax::testing::run_tool(train(out, 1, "", "--set run.checkpoint_every=0"));
    EXPECT_EQ(status, 0) << output;
    auto l = losses(out);
    EXPECT_EQ(l.size(), 6u) << output;
    // The MoE statistics are logged with every step.
    for (const auto& j : records(out)) {
      if (!j.contains("loss")) continue;
      for (const char* key : {"aux_loss", "z_loss", "expert_load_max_over_mean", "dropped_fraction"})
        EXPECT_TRUE(j.contains(key) && j[key].is_number()) << key << " missing: " << j.dump();
    }
    fs::remove_all(out);
    return l;
  }();
  return want;
}

// Every step of `want` within kTol of `got`'s.
void expect_near(const std::map<int, double>& got, const std::map<int, double>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": no loss at step " << step;
    EXPECT_NEAR(got.at(step), loss, kTol * loss) << what << ", step " << step;
  }
}

// The losses of `mesh` on `world` devices within kTol of one device's, both with `sets`
// (a model other than the shared one-device run's), the balancing statistics logged.
void expect_as_one_device(const std::string& what, int world, const std::string& mesh,
                          const std::string& sets) {
  const fs::path base = fresh("one_with"), out = fresh("mesh_with");
  const auto [s1, o1] = distjax::testing::run_tool(train(base, 1, "", sets));
  ASSERT_EQ(s1, 0) << o1;
  const auto [s2, o2] = distjax::testing::run_tool(train(out, world, mesh, sets));
  ASSERT_EQ(s2, 0) << what << "\n" << o2;
  const std::map<int, double> want = losses(base);
  ASSERT_EQ(want.size(), 6u);
  expect_near(losses(out), want, what);
  for (const auto& j : records(out))
    if (j.contains("loss")) EXPECT_TRUE(j.contains("expert_load_max_over_mean")) << j.dump();
  fs::remove_all(base);
  fs::remove_all(out);
}

void expect_same_losses(const std::string& what, int world, const std::string& mesh) {
  const std::map<int, double>& want = one_device();
  const fs::path out = fresh("mesh");
  const auto [status, output] =
      distjax::testing::run_tool(train(out, world, mesh, "--set run.checkpoint_every=0"));
  ASSERT_EQ(status, 0) << what << "\n" << output;
  expect_near(losses(out), want, what);
  fs::remove_all(out);
}

}  // namespace

TEST(DistjaxMoe, DataParallelMeshesTrainAsOneDevice) {
  expect_same_losses("data=2", 2, "");
  expect_same_losses("data=4", 4, "");
  expect_same_losses("fsdp data=2", 2,
                     "--set parallelism.shard=parameters --set parallelism.fsdp.min_weight_size=1");
  expect_same_losses("zero-1 data=2", 2, "--set parallelism.shard=optimizer");
  expect_same_losses("zero-2 data=2", 2, "--set parallelism.shard=gradients");
}

TEST(DistjaxMoe, ExpertParallelMeshesTrainAsOneDevice) {
  const std::string ep = "--set distributed.expert_parallel_size=";
  expect_same_losses("expert=2", 2, ep + "2");
  expect_same_losses("expert=4", 4, ep + "4");
  expect_same_losses("expert=8", 8, ep + "8");
  expect_same_losses("data=2 x expert=2", 4, ep + "2");
  expect_same_losses("data=2 x expert=4", 8, ep + "4");
  expect_same_losses("fsdp data=2 x expert=2", 4,
                     ep + "2 --set parallelism.shard=parameters "
                          "--set parallelism.fsdp.min_weight_size=1");
  // ZeRO splits what is replicated over data x expert; the experts, split over "expert",
  // stay whole and are averaged over "data".
  expect_same_losses("zero-1 data=2 x expert=2", 4, ep + "2 --set parallelism.shard=optimizer");
  expect_same_losses("zero-2 data=2 x expert=2", 4, ep + "2 --set parallelism.shard=gradients");
}

// The exchange in overlapped chunks and the all-gather dispatcher.
TEST(DistjaxMoe, EveryDispatcherTrainsAsOneDevice) {
  const std::string ep = "--set distributed.expert_parallel_size=";
  expect_same_losses("expert=4, exchange in 3 chunks", 4, ep + "4 --set model.moe.exchange_chunks=3");
  expect_same_losses("data=2 x expert=2, exchange in 2 chunks", 4,
                     ep + "2 --set model.moe.exchange_chunks=2");
  expect_same_losses("expert=4, all_gather", 4, ep + "4 --set model.moe.dispatcher=all_gather");
  expect_same_losses("expert=2 x cp=2, all_gather", 4,
                     ep + "2 --set distributed.context_parallel_size=2 "
                          "--set model.moe.dispatcher=all_gather");
}

// The MoE blocks inside the other splits: the megatron layout (the experts replicated over
// "model", each device running them on its tokens: all of them, or its sequence share with
// sequence parallelism), a context split (ring and Ulysses), and each beside an expert axis.
TEST(DistjaxMoe, TensorAndContextParallelMeshesTrainAsOneDevice) {
  const std::string ep = "--set distributed.expert_parallel_size=";
  expect_same_losses("tp=2", 2, "--set distributed.tensor_parallel_size=2");
  expect_same_losses("expert=2 x tp=2 sp", 4,
                     ep + "2 --set distributed.tensor_parallel_size=2 "
                          "--set parallelism.sequence_parallel=true");
  expect_same_losses("cp=2 ring", 2, "--set distributed.context_parallel_size=2");
  expect_same_losses("cp=2 ulysses", 2,
                     "--set distributed.context_parallel_size=2 "
                     "--set parallelism.context_parallel_method=ulysses");
  expect_same_losses("expert=2 x cp=2", 4, ep + "2 --set distributed.context_parallel_size=2");
  // Expert tensor parallelism: each expert's hidden width over "model".
  const std::string etp = " --set model.moe.expert_tensor_parallel=true";
  expect_same_losses("tp=2, experts split over it", 2, "--set distributed.tensor_parallel_size=2" + etp);
  expect_same_losses("expert=2 x tp=2, experts split over both", 4,
                     ep + "2 --set distributed.tensor_parallel_size=2" + etp);
  // With sequence parallelism (the layer gathers the sequence, routes it all, scatters the
  // summed outputs back); a shared expert, split over "model" beside the experts.
  const std::string sp = " --set parallelism.sequence_parallel=true";
  expect_same_losses("tp=2 sp, experts split over it", 2,
                     "--set distributed.tensor_parallel_size=2" + etp + sp);
  expect_same_losses("expert=2 x tp=2 sp, experts split over both", 4,
                     ep + "2 --set distributed.tensor_parallel_size=2" + etp + sp);
  expect_same_losses("tp=2 sp x cp=2, experts split over model", 4,
                     "--set distributed.tensor_parallel_size=2 "
                     "--set distributed.context_parallel_size=2" +
                         etp + sp);
  // The layouts whose stream splits the features: the MoE layer gathers them replicated
  // (its balancing loss counted once, on), each device keeps its block of the output.
  const std::string tp2 = "--set distributed.tensor_parallel_size=2 --set parallelism.tp_layout=";
  const std::string aux = "--set run.checkpoint_every=0 --set model.moe.aux_loss_coef=0.01";
  expect_as_one_device("tp=2 gather layout, balancing loss on", 2, tp2 + "gather", aux);
  expect_as_one_device("tp=2 async layout, experts split, balancing loss on", 2,
                       tp2 + "async" + etp, aux);
  expect_same_losses("expert=2 x tp=2 gather layout, experts split", 4,
                     ep + "2 " + tp2 + "gather" + etp);
  const std::string shared = "--set run.checkpoint_every=0 --set model.moe.shared_experts=1";
  expect_as_one_device("tp=2, experts and shared expert split over it", 2,
                       "--set distributed.tensor_parallel_size=2" + etp, shared);
  expect_as_one_device("expert=2 x tp=2 sp, experts and shared expert split", 4,
                       ep + "2 --set distributed.tensor_parallel_size=2" + etp + sp, shared);
}

// Rematerialised blocks and MLPs: the MoE layers run again in the backward pass, their
// balancing losses attached again (autodiff::add_loss), their statistics reported once.
// With the balancing loss in the objective (one device: aux_loss_coef 0.01), and beside an
// expert axis.
TEST(DistjaxMoe, RematerialisedMoeLayersTrainAsWithout) {
  const std::string aux = " --set model.moe.aux_loss_coef=0.01";
  const fs::path plain = fresh("remat_plain");
  const auto [status, output] = distjax::testing::run_tool(
      train(plain, 1, "", "--set run.checkpoint_every=0" + aux));
  ASSERT_EQ(status, 0) << output;
  const std::map<int, double> want = losses(plain);
  ASSERT_EQ(want.size(), 6u);
  for (const char* remat : {"Block", "MLP"}) {
    const fs::path out = fresh(std::string("remat_") + remat);
    const auto [st, got_output] = distjax::testing::run_tool(
        train(out, 1, "",
              "--set run.checkpoint_every=0" + aux + " --set 'parallelism.remat=[\"" + remat +
                  "\"]'"));
    ASSERT_EQ(st, 0) << got_output;
    expect_near(losses(out), want, remat);
    // The statistics once per layer and step, as without remat.
    for (const auto& j : records(out))
      if (j.contains("loss")) EXPECT_TRUE(j.contains("aux_loss")) << j.dump();
    fs::remove_all(out);
  }
  fs::remove_all(plain);
  expect_same_losses("data=2 x expert=2, remat Block", 4,
                     "--set distributed.expert_parallel_size=2 "
                     "--set 'parallelism.remat=[\"Block\"]'");
}

// MoE layers in a pipeline: their balancing losses reach the gradients from any stage
// (autodiff::add_loss, 1/m per micro-batch as the objective), their statistics and the
// balancing bias's loads are reported from the stage that holds them. Against one device
// with the same (untied) model: with the balancing loss on one micro-batch (the same
// objective), and without it on micro-batches (the balancing loss is a micro-batch's
// statistic, as a device's), beside an expert axis, with remat and with the bias.
TEST(DistjaxMoe, PipelinedMoeLayersTrainAsOneDevice) {
  const std::string untied = "--set run.checkpoint_every=0 --set model.tie_embeddings=false ";
  const auto compare = [&](const std::string& what, int world, const std::string& mesh,
                           const std::string& sets) {
    expect_as_one_device(what, world, mesh, untied + sets);
  };
  const std::string pipe = "--set distributed.pipeline_parallel_size=2 ";
  compare("pipe=2, balancing loss on", 2, pipe, "--set model.moe.aux_loss_coef=0.01");
  compare("pipe=2 gpipe, 4 micro-batches", 2,
          pipe + "--set parallelism.schedule=gpipe --set parallelism.microbatches=4", "");
  compare("expert=2 x pipe=2", 4, pipe + "--set distributed.expert_parallel_size=2", "");
  compare("pipe=2, remat Block", 2, pipe + "--set 'parallelism.remat=[\"Block\"]'", "");
  compare("pipe=2, balancing bias", 2, pipe, "--set model.moe.balance_bias_rate=0.05");
  compare("pipe=2 x tp=2 sp, experts and a shared expert split over model", 4,
          pipe +
              "--set distributed.tensor_parallel_size=2 --set parallelism.sequence_parallel=true "
              "--set model.moe.expert_tensor_parallel=true",
          "--set model.moe.shared_experts=1");
}

// The balancing bias (model.moe.balance_bias_rate) moves by the step's loads summed over its
// micro-batches and devices, so every mesh moves it as one device does: the same losses.
TEST(DistjaxMoe, TheBalancingBiasMovesAsOnOneDevice) {
  const std::string bias = " --set model.moe.balance_bias_rate=0.05";
  const fs::path one = fresh("bias_one");
  const auto [status, output] = distjax::testing::run_tool(train(one, 1, "", bias));
  ASSERT_EQ(status, 0) << output;
  const std::map<int, double> want = losses(one);
  ASSERT_EQ(want.size(), 6u) << output;
  for (const auto& [name, world, mesh] :
       {std::tuple{"grad_accum=2", 1, std::string("--set run.grad_accum_steps=2")},
        std::tuple{"data=2 x expert=2", 4, std::string("--set distributed.expert_parallel_size=2")},
        std::tuple{"expert=2 x cp=2", 4,
                   std::string("--set distributed.expert_parallel_size=2 "
                               "--set distributed.context_parallel_size=2")},
        std::tuple{"tp=2 sp, experts split over it", 2,
                   std::string("--set distributed.tensor_parallel_size=2 "
                               "--set parallelism.sequence_parallel=true "
                               "--set model.moe.expert_tensor_parallel=true")}}) {
    const fs::path out = fresh("bias_mesh");
    const auto [s2, log] = distjax::testing::run_tool(train(out, world, mesh, bias));
    ASSERT_EQ(s2, 0) << name << "\n" << log;
    const std::map<int, double> got = losses(out);
    for (const auto& [step, loss] : want) {
      ASSERT_TRUE(got.count(step)) << name << ": no loss at step " << step;
      EXPECT_NEAR(got.at(step), loss, kTol * loss) << name << ", step " << step;
    }
    fs::remove_all(out);
  }
  fs::remove_all(one);
}

// Balancing works: on the fortunes GPT with the balancing loss off, the bias brings the
// busiest expert's load under 1.3 times the mean within 300 steps (measured 1.25, the mean
// over steps 276-300); without it the load stays far from balanced (2.28).
TEST(DistjaxMoe, TheBalancingBiasBalancesTheExperts) {
  auto lowest_load = [](const std::string& rate) {
    const fs::path out = fresh("balance");
    const auto [status, output] = distjax::testing::run_tool(
        std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
        "/configs/gpt_moe.toml --set distributed.world_size=1 "
        "--set distributed.expert_parallel_size=1 --set model.moe.aux_loss_coef=0 "
        "--set run.steps=300 --set run.log_every=25 --set run.eval_every=0 "
        "--set run.eval_batches=1 --set model.moe.balance_bias_rate=" + rate +
        " --out " + out.string());
    EXPECT_EQ(status, 0) << output;
    double lowest = 1e9;
    int windows = 0;
    for (const auto& j : records(out))
      if (j.contains("expert_load_max_over_mean")) {
        lowest = std::min(lowest, j["expert_load_max_over_mean"].get<double>());
        ++windows;
      }
    EXPECT_EQ(windows, 12) << output;
    fs::remove_all(out);
    return lowest;
  };
  EXPECT_LT(lowest_load("0.005"), 1.3);
  EXPECT_GT(lowest_load("0"), 1.8);
}

// The experts are split over "expert": a checkpoint saved with them over 2 devices resumes
// with them over 4, or on one device, with the optimizer state, and goes on as the run that
// saved it.
TEST(DistjaxMoe, ACheckpointResumesOnAnotherExpertParallelSize) {
  const fs::path base = fresh("resume");
  const auto [status, output] = distjax::testing::run_tool(
      train(base / "ep2", 2, "--set distributed.expert_parallel_size=2",
            "--set run.checkpoint_every=4"));
  ASSERT_EQ(status, 0) << output;
  const std::map<int, double> want = losses(base / "ep2");
  ASSERT_EQ(want.size(), 6u) << output;
  auto resume_on = [](int world, int ep) {
    return [world, ep](const fs::path& out) {
      return train(out, world, "--set distributed.expert_parallel_size=" + std::to_string(ep),
                   "--set run.checkpoint_every=0 --resume");
    };
  };
  distjax::testing::expect_resumes_as_saved(base / "ep2", want,
                                            {{"ep4", resume_on(4, 4)}, {"ep1", resume_on(1, 1)}},
                                            kTol);
  // Under ZeRO-1 the experts' optimizer state is split over "data" (the replicas holding
  // the same experts): saved whole, it resumes on another split and without ZeRO.
  const std::string zero = "--set parallelism.shard=optimizer";
  const auto [zstatus, zoutput] = distjax::testing::run_tool(
      train(base / "zero", 4, "--set distributed.expert_parallel_size=2 " + zero,
            "--set run.checkpoint_every=4"));
  ASSERT_EQ(zstatus, 0) << zoutput;
  const std::map<int, double> zwant = losses(base / "zero");
  ASSERT_EQ(zwant.size(), 6u) << zoutput;
  expect_near(zwant, want, "ZeRO-1 data 2 x expert 2 against expert 2");
  auto resume_zero_on = [&](int world, int ep, const std::string& shard) {
    return [=](const fs::path& out) {
      return train(out, world,
                   "--set distributed.expert_parallel_size=" + std::to_string(ep) + " " + shard,
                   "--set run.checkpoint_every=0 --resume");
    };
  };
  distjax::testing::expect_resumes_as_saved(
      base / "zero", zwant,
      {{"zero2-ep4", resume_zero_on(4, 4, "--set parallelism.shard=gradients")},
       {"plain-ep2", resume_zero_on(2, 2, "")}},
      kTol);
  fs::remove_all(base);
}

TEST(DistjaxMoe, BadSettingsAreRefusedNamingTheKeys) {
  const fs::path out = fresh("bad");
  const auto refused = [&](const std::string& command, const std::vector<std::string>& words) {
    const auto [status, output] = distjax::testing::run_tool(command);
    EXPECT_NE(status, 0) << command << "\n" << output;
    EXPECT_EQ(output.find("step 1/"), std::string::npos) << "a step ran: " << output;
    for (const std::string& w : words)
      EXPECT_NE(output.find(w), std::string::npos) << "no \"" << w << "\" in:\n" << output;
  };
  refused(train(out, 1, "", "--set model.moe.top_k=9"), {"model.moe.top_k = 9", "[1, 8]"});
  refused(train(out, 1, "", "--set model.moe.experts=4 --set model.moe.top_k=5"),
          {"model.moe.top_k = 5", "[1, 4]"});
  // The experts split evenly; an expert axis needs experts; it divides the data devices.
  refused(train(out, 4, "--set distributed.expert_parallel_size=4 --set model.moe.experts=6"),
          {"model.moe.experts = 6", "distributed.expert_parallel_size = 4"});
  refused(train(out, 2, "--set distributed.expert_parallel_size=2 --set model.moe.experts=0"),
          {"distributed.expert_parallel_size = 2", "[model.moe]"});
  refused(train(out, 6, "--set distributed.expert_parallel_size=4"),
          {"expert_parallel_size = 4 must divide the data-parallel size 6"});
  refused(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
              "/configs/train_mnist.toml --set distributed.world_size=2 "
              "--set distributed.expert_parallel_size=2 --out " + out.string(),
          {"distributed.expert_parallel_size = 2", "no expert parallelism"});
  refused(train(out, 1, "", "--set model.moe.capacity_factor=-0.5"),
          {"model.moe.capacity_factor = -0.5", "-1 for dropless"});
  refused(train(out, 1, "", "--set model.moe.capacity_factor=0"),
          {"model.moe.capacity_factor = 0"});
  refused(train(out, 1, "", "--set model.moe.every=3"), {"model.moe.every = 3", "model.layers = 2"});
  refused(train(out, 1, "", "--set model.moe.activation=relu"),
          {"model.moe.activation", "gelu", "swiglu"});
  refused(train(out, 2,
                "--set distributed.tensor_parallel_size=2 "
                "--set model.moe.balance_bias_rate=0.05 "
                "--set parallelism.sequence_parallel=true"),
          {"model.moe.balance_bias_rate", "parallelism.sequence_parallel"});
  refused(train(out, 4, "--set distributed.tensor_parallel_size=4 "
                        "--set model.moe.expert_tensor_parallel=true --set model.moe.hidden=258"),
          {"model.moe.expert_tensor_parallel", "258", "tensor_parallel_size = 4"});
  refused(train(out, 1, "", "--set distributed.mixed_precision=fp16"),
          {"[model.moe]", "distributed.mixed_precision = \"fp16\"", "bf16"});
  refused(train(out, 1, "", "--set model.moe.dispatcher=ring"),
          {"model.moe.dispatcher", "all_to_all", "all_gather"});
  refused(train(out, 1, "", "--set model.moe.exchange_chunks=0"),
          {"model.moe.exchange_chunks = 0", "[1, 64]"});
  refused(
      train(out, 1, "", "--set model.moe.exchange_chunks=2 --set model.moe.dispatcher=all_gather"),
      {"model.moe.exchange_chunks = 2", "all_gather"});
  fs::remove_all(out);
}
