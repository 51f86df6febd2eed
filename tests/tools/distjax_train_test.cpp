// End to end: `distjax train configs/train_mnist.toml --set run.steps=3 --out DIR` writes
// metrics.jsonl, summary.json and config.toml; a bad override fails naming it; a directory
// another run holds is refused;
// distributed.mixed_precision = "bf16" / "fp16" runs the GPT programs (pipelined too) and is
// refused elsewhere.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "tools/tool_run.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/app/train.hpp"
#include "distjax/config/train_config.hpp"

namespace fs = std::filesystem;

namespace {

std::pair<int, std::string> run(const std::string& command) {
  return distjax::testing::run_tool(command);
}

}  // namespace

TEST(DistjaxTrain, ThreeStepsWriteMetrics) {
  const fs::path out = fs::temp_directory_path() / "distjax_train_test";
  fs::remove_all(out);
  const auto [status, output] = run(
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/train_mnist.toml --set run.steps=3 --set run.log_every=1 --out " + out.string());
  ASSERT_EQ(status, 0) << output;
  ASSERT_TRUE(fs::exists(out / "metrics.jsonl")) << output;
  std::ifstream metrics(out / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) ++records;
  }
  EXPECT_GE(records, 3) << "one record per step with run.log_every = 1";
  const auto summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  EXPECT_EQ(summary["steps"], 3);
  EXPECT_EQ(summary["backend"], "threads");
  // The config as run, with the override, is kept next to the metrics.
  std::stringstream cfg;
  cfg << std::ifstream(out / "config.toml").rdbuf();
  EXPECT_NE(cfg.str().find("steps = 3"), std::string::npos) << cfg.str();
  fs::remove_all(out);
}

TEST(DistjaxTrain, BadOverrideFailsNamingIt) {
  const auto [status, output] = run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                                    "/configs/train_mnist.toml --set run.stepz=3");
  EXPECT_EQ(status, 1);
  EXPECT_NE(
      output.find("--set run.stepz=3: unknown key \"run.stepz\"; did you mean \"run.steps\"?"),
      std::string::npos)
      << output;
}

TEST(DistjaxTrain, InvalidConfigListsProblems) {
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/tensor_parallelism.toml --set distributed.world_size=4");
  EXPECT_EQ(status, 1);
  EXPECT_NE(output.find("mesh_shape = [2, 4] has 8 devices but world_size is 4"), std::string::npos)
      << output;
}

// The metrics records of a run directory.
std::vector<nlohmann::json> records_of(const fs::path& out) {
  std::vector<nlohmann::json> r;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    r.push_back(nlohmann::json::parse(line));
  return r;
}

TEST(DistjaxTrain, Bf16GptRunsWithTheMixedPrecisionKey) {
  const fs::path out = fs::temp_directory_path() / "distjax_train_bf16_test";
  fs::remove_all(out);
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/train_gpt.toml --set distributed.mixed_precision=bf16 --set run.steps=4 "
          "--set run.log_every=1 --set run.eval_every=4 --set run.eval_batches=1 "
          "--set model.layers=1 --out " +
          out.string());
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("precision bf16 compute, f32 params"), std::string::npos) << output;
  int losses = 0;
  for (const auto& j : records_of(out))
    if (j.contains("loss")) {
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
      EXPECT_FALSE(j.contains("loss_scale"));  // bf16 needs no loss scale
      ++losses;
    }
  EXPECT_GE(losses, 4);
  fs::remove_all(out);
}

// The GPT program on one device that is not the CPU (the checked device: what a GPU runs,
// on this machine): its train steps make the host wait for nothing; the logs read.
TEST(DistjaxTrain, OneDeviceGptStepsMakeNoHostWait) {
  const fs::path out = fs::temp_directory_path() / "distjax_train_waits_test";
  fs::remove_all(out);
  for (const char* precision : {"no", "bf16"}) {
    const auto [status, output] =
        run("DISTJAX_DEVICE=checked " + std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
            "/configs/train_gpt.toml --set distributed.mixed_precision=" + precision +
            " --set run.steps=4 --set run.log_every=2 --set run.eval_every=0 "
            "--set run.eval_batches=1 --set model.layers=1 --out " +
            out.string());
    ASSERT_EQ(status, 0) << output;
    const auto summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    EXPECT_EQ(summary["steps"], 4);
    EXPECT_EQ(summary["host_waits_in_steps"], 0) << precision << "\n" << output;
    int losses = 0;
    for (const auto& j : records_of(out))
      if (j.contains("loss")) {
        EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
        EXPECT_GT(j["grad_norm"].get<double>(), 0.0);
        ++losses;
      }
    EXPECT_EQ(losses, 2) << output;
    fs::remove_all(out);
  }
}

TEST(DistjaxTrain, Fp16GptOnTwoDevicesReportsTheLossScale) {
  const fs::path out = fs::temp_directory_path() / "distjax_train_fp16_test";
  fs::remove_all(out);
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/tensor_parallel_gpt.toml --set distributed.mixed_precision=fp16 "
          "--set distributed.world_size=2 --set distributed.tensor_parallel_size=2 "
          "--set distributed.mesh_shape=[1,2] --set run.steps=3 --set run.log_every=1 "
          "--set run.eval_batches=1 --set model.layers=1 --out " +
          out.string());
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("precision f16 compute, f32 params"), std::string::npos) << output;
  int scaled = 0;
  for (const auto& j : records_of(out))
    if (j.contains("loss_scale")) {
      EXPECT_EQ(j["loss_scale"].get<double>(), 32768.0);
      EXPECT_EQ(j["skipped_steps"].get<double>(), 0.0);
      ++scaled;
    }
  EXPECT_GE(scaled, 3) << output;
  fs::remove_all(out);
}

TEST(DistjaxTrain, MixedPrecisionIsRefusedWhereNotWired) {
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/train_mnist.toml --set distributed.mixed_precision=bf16");
  EXPECT_EQ(status, 1);
  EXPECT_NE(output.find("[classifier] distributed.mixed_precision = \"bf16\" is not implemented "
                        "for this program"),
            std::string::npos)
      << output;
}

TEST(DistjaxTrain, Bf16AndFp16OnTheDataTensorPipeMesh) {
  const fs::path out = fs::temp_directory_path() / "distjax_train_bf16_3d_test";
  fs::remove_all(out);
  const std::string base = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                           "/configs/gpt_3d.toml --set run.steps=2 --set run.eval_batches=1 "
                           "--set run.checkpoint_every=0 --set run.timeline=false --out " +
                           out.string();
  const auto [status, output] = run(base + " --set distributed.mixed_precision=bf16");
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("precision bf16 compute, f32 params"), std::string::npos) << output;
  // fp16 under the pipeline: the loss scale scales the pipeline's loss function.
  fs::remove_all(out);
  const auto [status16, output16] =
      run(base + " --set distributed.mixed_precision=fp16 --set run.log_every=1");
  ASSERT_EQ(status16, 0) << output16;
  EXPECT_NE(output16.find("precision f16 compute, f32 params"), std::string::npos) << output16;
  int scaled = 0;
  for (const auto& j : records_of(out))
    if (j.contains("loss_scale")) {
      EXPECT_EQ(j["loss_scale"].get<double>(), 32768.0);
      EXPECT_EQ(j["skipped_steps"].get<double>(), 0.0);
      ++scaled;
    }
  EXPECT_GE(scaled, 2) << output16;
  fs::remove_all(out);
}

// A mesh axis no strategy of the program uses is refused (its devices would compute the
// same thing), naming the axis and what to do.
TEST(DistjaxTrain, AMeshAxisNoStrategyUsesIsRefused) {
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/tensor_parallel_gpt.toml --set run.steps=1 --set distributed.mesh_shape=2,2,2 "
          "--set distributed.mesh_axis_names=data,model,extra --set "
          "distributed.tensor_parallel_size=2 --out " +
          (fs::temp_directory_path() / "distjax_idle_axis_test").string());
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("mesh axis \"extra\" (size 2) is used by no strategy of this program"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("Remove it from distributed.mesh_axis_names"), std::string::npos) << output;
}

// The GPT under ZeRO-1 and ZeRO-2 (the optimizer state, and the gradients, split over
// "data"): the losses of one device within 1e-6, beside tensor parallelism and a pipeline
// (ZeRO-1); ZeRO-2 under a pipeline is refused naming the keys before any step.
TEST(DistjaxTrain, GptUnderZeroTrainsAsOneDevice) {
  const std::string base = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                           "/configs/gpt_3d.toml --set run.steps=4 --set run.log_every=1 "
                           "--set run.eval_every=0 --set run.eval_batches=1 "
                           "--set run.checkpoint_every=0 ";
  const auto losses = [&](const std::string& name, const std::string& sets) {
    const fs::path out = fs::temp_directory_path() / ("distjax_zero_gpt_" + name);
    fs::remove_all(out);
    const auto [status, output] = run(base + sets + " --out " + out.string());
    EXPECT_EQ(status, 0) << name << "\n" << output;
    std::vector<double> l;
    std::ifstream f(out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) l.push_back(j["loss"].get<double>());
    }
    fs::remove_all(out);
    return l;
  };
  const std::vector<double> want = losses(
      "one", "--set distributed.world_size=1 --set distributed.tensor_parallel_size=1 "
             "--set distributed.pipeline_parallel_size=1");
  ASSERT_EQ(want.size(), 4u);
  for (const auto& [name, sets] :
       {std::pair<std::string, std::string>{"zero1_3d", "--set parallelism.shard=optimizer"},
        {"zero2_data4", "--set parallelism.shard=gradients --set distributed.world_size=4 "
                        "--set distributed.tensor_parallel_size=1 "
                        "--set distributed.pipeline_parallel_size=1"},
        {"zero2_tp2", "--set parallelism.shard=gradients --set distributed.world_size=4 "
                      "--set distributed.pipeline_parallel_size=1"}}) {
    const std::vector<double> got = losses(name, sets);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], distjax::testing::loss_bound(1e-6) * want[i])
          << name << ", step " << i + 1;
  }
  const auto [status, output] =
      run(base + "--set parallelism.shard=gradients --out " +
          (fs::temp_directory_path() / "distjax_zero2_pipe_test").string());
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("parallelism.shard = \"gradients\" (ZeRO-2) with a \"pipe\" axis of 2"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("step 1/"), std::string::npos) << output;
}

// The parameter tree is the config's: a pipeline cannot tie the embeddings, so asking it to
// is an error naming the key (not an untied model behind the user's back).
TEST(DistjaxTrain, TiedEmbeddingsUnderAPipelineAreRefused) {
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/gpt_3d.toml --set run.steps=1 --set model.tie_embeddings=true --out " +
          (fs::temp_directory_path() / "distjax_tied_pipe_test").string());
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("model.tie_embeddings = true with pipeline_parallel_size = 2"),
            std::string::npos)
      << output;
}

// A learning rate of nan (or inf) is refused with its key before anything runs.
TEST(DistjaxTrain, NanLearningRateIsRefused) {
  for (const char* value : {"nan", "inf"}) {
    const auto [status, output] =
        run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
            "/configs/train_mnist.toml --set run.steps=1 --set optimizer.lr=" + value + " --out " +
            (fs::temp_directory_path() / "distjax_nan_lr_test").string());
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find(std::string("optimizer.lr = ") + value + " must be a finite number"),
              std::string::npos)
        << output;
  }
}

// A run that diverges (a learning rate of 1e30) stops at the first step whose loss or
// gradient norm is not finite, with status 1 and the step in the message; the latest
// checkpoint is the step before (nothing of the broken step is saved).
TEST(DistjaxTrain, ADivergingRunStopsAtItsFirstNonFiniteStep) {
  const fs::path out = fs::temp_directory_path() / "distjax_diverge_test";
  fs::remove_all(out);
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/train_mnist.toml --set run.steps=20 --set optimizer.lr=1e30 --set "
          "optimizer.warmup_steps=0 --set run.checkpoint_every=1 --set run.log_every=1 --out " +
          out.string());
  EXPECT_EQ(status, 1) << output;
  const auto at = output.find("[Trainer] step ");
  ASSERT_NE(at, std::string::npos) << output;
  const int step = std::stoi(output.substr(at + 15));
  EXPECT_GE(step, 1);
  EXPECT_TRUE(output.find("the loss is nan", at) != std::string::npos ||
              output.find("the loss is inf", at) != std::string::npos ||
              output.find("the gradient norm is", at) != std::string::npos)
      << output;
  char want[32], broken[32];
  std::snprintf(want, sizeof want, "step_%08d", step - 1);
  std::snprintf(broken, sizeof broken, "step_%08d", step);
  std::ifstream latest(out / "checkpoints" / "latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(fs::path(name).filename().string(), want) << output;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / want)) << output;
  EXPECT_FALSE(fs::exists(out / "checkpoints" / broken)) << output;
  fs::remove_all(out);
}

// An output directory that cannot be made is a config error naming the key and the path.
TEST(DistjaxTrain, AnUnusableOutDirNamesTheKey) {
  const fs::path file =
      fs::temp_directory_path() / ("distjax_out_file_" + std::to_string(getpid()));
  std::ofstream(file) << "a file, not a directory\n";
  for (const std::string& out :
       {(file / "run").string(), std::string("/proc/distjax_no_such_dir")}) {
    SCOPED_TRACE(out);
    const auto [status, output] = run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                                      "/configs/train_mnist.toml --set run.steps=1 --out " + out);
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find("run.out_dir = \"" + out + "\""), std::string::npos) << output;
  }
  fs::remove(file);
}

// A run holds its output directory: a second run into it is refused before it writes
// anything, naming the holder, instead of mixing its metrics with the first's; once the
// holder is gone the directory is free again. This test process holds the directory as a
// running `distjax train` would (app::hold_out_dir, which prepare_program calls).
TEST(DistjaxTrain, ASecondRunIntoAHeldOutDirIsRefused) {
  const fs::path out = fs::temp_directory_path() / ("distjax_held_out_" + std::to_string(getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string train = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                            "/configs/train_mnist.toml --set run.steps=1 --out " + out.string();
  // The holder: a child process that takes the lock, says so, and waits to be told to go.
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    distjax::config::TrainConfig c;
    c.run.out_dir = out.string();
    int code = 0;
    try {
      distjax::app::hold_out_dir(c);
    } catch (...) {
      code = 1;
    }
    char b = code == 0 ? 'y' : 'n';
    if (write(ready[1], &b, 1) != 1) _exit(2);
    if (read(go[0], &b, 1) < 0) _exit(2);
    _exit(code);
  }
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  ASSERT_EQ(b, 'y') << "the holder could not take the lock";
  const auto [status, output] = run(train);
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("run.out_dir = \"" + out.string() + "\" is in use by another run (pid " +
                        std::to_string(holder)),
            std::string::npos)
      << output;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "the refused run wrote metrics";
  // The holder ends: the directory is free.
  ASSERT_EQ(write(go[1], &b, 1), 1);
  int holder_status = 0;
  waitpid(holder, &holder_status, 0);
  const auto [status2, output2] = run(train);
  EXPECT_EQ(status2, 0) << output2;
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  fs::remove_all(out);
}

// summary.json's num_parameters is the whole model's (the count the GPT program prints),
// and num_parameters_on_device this device's share: on the (2, 2, 2) mesh, device 0 holds
// half of each tensor-parallel matrix and one pipeline stage.
TEST(DistjaxTrain, SummaryCountsTheWholeModelsParameters) {
  const fs::path out = fs::temp_directory_path() / ("distjax_num_params_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/gpt_3d.toml --set run.steps=1 --set run.eval_batches=1 --set "
          "run.checkpoint_every=0 --set run.timeline=false --out " + out.string());
  ASSERT_EQ(status, 0) << output;
  std::ifstream sf(out / "summary.json");
  const nlohmann::json s = nlohmann::json::parse(sf);
  const auto total = s["num_parameters"].get<long long>();
  const auto mine = s["num_parameters_on_device"].get<long long>();
  const auto grouped = [](long long n) {  // as the line prints counts: 1,234,567
    std::string digits = std::to_string(n), out;
    for (std::size_t i = 0; i < digits.size(); ++i)
      out += (i > 0 && (digits.size() - i) % 3 == 0 ? "," : "") + digits.substr(i, 1);
    return out;
  };
  EXPECT_NE(output.find(": " + grouped(total) + " parameters, " + grouped(mine) + " on device 0"),
            std::string::npos)
      << output;
  EXPECT_LT(2 * mine, total);
  fs::remove_all(out);
}

// A message ends with what went wrong; the source location that raised it is for debugging,
// added with DISTJAX_DEBUG=1.
TEST(DistjaxTrain, MessagesNameTheSourceOnlyInDebugMode) {
  const std::string train = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                            "/configs/train_mnist.toml --set run.steps=1 --out /proc/distjax_x";
  const auto [status, output] = run(train);
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find("cannot create the directory"), std::string::npos) << output;
  EXPECT_EQ(output.find(".cpp:"), std::string::npos) << output;
  const auto [status2, output2] = run("DISTJAX_DEBUG=1 " + train);
  EXPECT_EQ(status2, 1) << output2;
  EXPECT_NE(output2.find("src/distjax/app/prepare.cpp:"), std::string::npos) << output2;
}
