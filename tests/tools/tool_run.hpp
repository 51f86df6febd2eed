// Running the distjax command from the tests/tools tests: a shell command without a
// launcher's variables (so it runs on the threads backend), its exit status and output.
#pragma once

#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace distjax::testing {

/// The bound of a loss compared across meshes within a few f32 ulps. The optimised build's
/// sums stay within it; a build under AddressSanitizer and UndefinedBehaviorSanitizer
/// (make test-asan) instruments the loops, which changes which of them vectorise and so
/// the order of their sums: there the losses of two meshes measured 1.02e-6 relative
/// (DistjaxTrain.GptUnderZeroTrainsAsOneDevice) and 1.25e-6 absolute
/// (DistjaxResume.CheckpointMovesBetweenMeshesWithAndWithoutAPipe) against 1e-6, with no
/// sanitizer finding. That build checks memory, not the last ulps: twice the bound.
inline double loss_bound(double optimised) {
#if defined(__SANITIZE_ADDRESS__)
  return 2 * optimised;
#else
  return optimised;
#endif
}

/// Runs `command` through the shell without OMPI_* / PMI_* / SLURM_* / RANK / WORLD_SIZE
/// and with OMP_WAIT_POLICY=passive; returns (exit status, stdout and stderr).
inline std::pair<int, std::string> run_tool(const std::string& command) {
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

/// The first Python that runs `imports` (e.g. "import tokenizers"): $DISTJAX_PYTHON, the venv
/// scripts/setup_python.sh makes, python3. Empty when none does.
inline std::string python_that_runs(const std::string& imports) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("DISTJAX_PYTHON")) candidates.emplace_back(p);
  candidates.push_back(std::string(DISTJAX_SOURCE_DIR) + "/.venv-test/bin/python");
  candidates.emplace_back("python3");
  for (const auto& c : candidates)
    if (std::system(("'" + c + "' -c '" + imports + "' >/dev/null 2>&1").c_str()) == 0) return c;
  return {};
}

/// step -> logged train loss, from a run's metrics.jsonl.
inline std::map<int, double> train_losses(const std::filesystem::path& out) {
  std::map<int, double> got;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j["loss"].is_number()) got[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return got;
}

/// A checkpoint resumed on other meshes goes on as the run that saved it. `saved` ran 6 steps
/// with a checkpoint at step 4 (its losses in `want`); each of `resumes` is (name, the
/// command that resumes into a given directory), run on a copy of that checkpoint: steps 5
/// and 6 within `tol` relative of the saved run's.
inline void expect_resumes_as_saved(
    const std::filesystem::path& saved, const std::map<int, double>& want,
    const std::vector<std::pair<std::string,
                                std::function<std::string(const std::filesystem::path&)>>>& resumes,
    double tol) {
  namespace fs = std::filesystem;
  for (const auto& [name, command] : resumes) {
    const fs::path out = saved.parent_path() / name;
    fs::create_directories(out / "checkpoints");
    fs::copy(saved / "checkpoints" / "step_00000004", out / "checkpoints" / "step_00000004",
             fs::copy_options::recursive);
    const auto [s, log] = run_tool(command(out));
    ASSERT_EQ(s, 0) << log;
    EXPECT_NE(log.find("at step 4"), std::string::npos) << log;
    const std::map<int, double> got = train_losses(out);
    for (int step : {5, 6}) {
      ASSERT_TRUE(got.count(step)) << name << "\n" << log;
      EXPECT_NEAR(got.at(step), want.at(step), tol * want.at(step)) << name << ", step " << step;
    }
  }
}

}  // namespace distjax::testing
