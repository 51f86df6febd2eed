// `distjax train` under mpirun, as a user runs it (one ctest entry at a time with the MPI
// tests: RESOURCE_LOCK mpi_job): the ranks' output as the user sees it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tools/tool_run.hpp"

namespace fs = std::filesystem;

namespace {

std::pair<int, std::string> run(const std::string& command) {
  return distjax::testing::run_tool(command);
}

}  // namespace

// Under mpirun the ranks' stdout is mpirun's pty, whatever the user's output is (here a
// pipe): the log lines only, without the progress bar's carriage returns and terminal codes,
// and the closing lines once (rank 0).
TEST(DistjaxTrain, UnderMpirunTheOutputHasNoProgressBar) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const fs::path out = fs::temp_directory_path() / ("distjax_mpirun_out_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto [status, output] =
      run("OMP_WAIT_POLICY=passive mpirun --allow-run-as-root --oversubscribe -np 2 " +
          std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
          "/configs/train_mnist.toml --set run.steps=3 --set run.log_every=1 --out " +
          out.string());
  if (output.find("MPI backend") != std::string::npos &&
      output.find("not built") != std::string::npos)
    GTEST_SKIP() << "this build has no MPI backend: " << output;
  ASSERT_EQ(status, 0) << output;
  EXPECT_EQ(output.find('\r'), std::string::npos) << output;
  EXPECT_EQ(output.find("\033["), std::string::npos) << output;
  std::size_t done = 0;
  for (std::size_t at = output.find("done: "); at != std::string::npos;
       at = output.find("done: ", at + 1))
    ++done;
  EXPECT_EQ(done, 1u) << output;
  fs::remove_all(out);
}
