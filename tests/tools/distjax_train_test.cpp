// End to end: `distjax train configs/train_mnist.toml --set run.steps=3 --out DIR` writes
// metrics.jsonl, summary.json and config.toml; a bad override fails naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

// Runs a shell command without a launcher's variables; returns (exit status, output).
std::pair<int, std::string> run(const std::string& command) {
  const std::string cmd =
      "env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE -u "
      "SLURM_PROCID -u SLURM_NTASKS -u RANK -u WORLD_SIZE OMP_WAIT_POLICY=passive " +
      command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr)
    out += buf;
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
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
