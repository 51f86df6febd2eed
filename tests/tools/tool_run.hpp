// Running the distjax command from the tests/tools tests: a shell command without a
// launcher's variables (so it runs on the threads backend), its exit status and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace distjax::testing {

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

}  // namespace distjax::testing
