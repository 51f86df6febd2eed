// The main job's checkpoints end to end: `distjax train configs/gpt_3d.toml` (GPT on a
// (data 2, model 2, pipe 2) mesh) killed with SIGKILL after a checkpoint and resumed with
// --resume logs exactly the losses of a run that was never stopped; `distjax ckpt
// inspect` lists the saved tensors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<std::string> job_args(const fs::path& out, bool resume) {
  std::vector<std::string> a = {DISTJAX_TOOL, "train", std::string(DISTJAX_SOURCE_DIR) + "/configs/gpt_3d.toml",
                                "--set", "run.steps=24", "--set", "run.log_every=4", "--set",
                                "run.eval_every=0", "--set", "run.checkpoint_every=4", "--set",
                                "run.timeline=false", "--out", out.string()};
  if (resume) a.push_back("--resume");
  return a;
}

// Starts the command with its output to `log`; returns the pid.
pid_t start(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                          "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"})
      unsetenv(v);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    std::vector<char*> argv;
    for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// step -> logged train loss.
std::map<int, double> losses(const fs::path& metrics) {
  std::map<int, double> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j["loss"].is_number()) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace

TEST(DistjaxResume, KilledMainJobResumesExactly) {
  const fs::path base = fs::temp_directory_path() / ("distjax_resume_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  // The run that is never stopped.
  ASSERT_EQ(wait_for(start(job_args(base / "whole", false), base / "whole.log")), 0)
      << slurp(base / "whole.log");
  const std::map<int, double> want = losses(base / "whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u) << slurp(base / "whole.log");

  // The same run, SIGKILLed as soon as its step-8 checkpoint is complete.
  const pid_t pid = start(job_args(base / "cut", false), base / "cut.log");
  const fs::path ckpt = base / "cut" / "checkpoints" / "step_00000008";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(ckpt / "index.json") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGKILL);
  const int killed = wait_for(pid);
  ASSERT_TRUE(fs::exists(ckpt / "index.json")) << slurp(base / "cut.log");
  const std::map<int, double> before = losses(base / "cut" / "metrics.jsonl");
  ASSERT_LT(before.size(), want.size()) << "the run finished before it was killed (status "
                                        << killed << "): nothing was resumed";

  ASSERT_EQ(wait_for(start(job_args(base / "cut", true), base / "resumed.log")), 0)
      << slurp(base / "resumed.log");
  const std::string resumed = slurp(base / "resumed.log");
  const auto at = resumed.find("Resumed from");
  ASSERT_NE(at, std::string::npos) << resumed;
  const int from = std::stoi(resumed.substr(resumed.find("at step ", at) + 8));
  EXPECT_GE(from, 8);
  // The resumed run logged only steps after its checkpoint: each earlier step once.
  std::map<int, int> count;
  {
    std::ifstream f(base / "cut" / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) ++count[nlohmann::json::parse(line)["step"].get<int>()];
  }
  for (const auto& [step, n] : count)
    if (step <= from) EXPECT_EQ(n, 1) << "step " << step << " logged again after resuming";
  const std::map<int, double> got = losses(base / "cut" / "metrics.jsonl");
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << "no loss logged at step " << step;
    EXPECT_EQ(got.at(step), loss) << "step " << step;  // bit for bit
  }

  // distjax ckpt inspect names the mesh and the tensors.
  const fs::path inspect_log = base / "inspect.log";
  ASSERT_EQ(wait_for(start({DISTJAX_TOOL, "ckpt", "inspect", (base / "cut" / "checkpoints").string()},
                           inspect_log)),
            0);
  const std::string listing = slurp(inspect_log);
  EXPECT_NE(listing.find("step 24"), std::string::npos) << listing;
  EXPECT_NE(listing.find("(\"data\"=2, \"model\"=2, \"pipe\"=2)"), std::string::npos) << listing;
  EXPECT_NE(listing.find("params/blocks/3/mlp/fc2/kernel"), std::string::npos) << listing;
  fs::remove_all(base);
}
