// `distjax train` under mpirun, as a user runs it (one ctest entry at a time with the MPI
// tests: RESOURCE_LOCK mpi_job): the ranks' output as the user sees it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distjax/data/token_shards.hpp"
#include "tools/tool_run.hpp"

namespace fs = std::filesystem;

namespace {

std::pair<int, std::string> run(const std::string& command) {
  return distjax::testing::run_tool(command);
}

}  // namespace

// Under mpirun the ranks' stdout is mpirun's pty, whatever the user's output is (here a
// pipe): the log lines only, without the progress bar's carriage returns and terminal codes,
// the closing lines once (rank 0), and the hosts the processes run on, once.
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
  // The processes and the host the launcher placed them on, once.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string placed = "Processes: 2 on 1 host: " + std::string(host) + " (ranks 0-1)\n";
  EXPECT_NE(output.find(placed), std::string::npos) << output;
  EXPECT_EQ(output.find("Processes:"), output.rfind("Processes:")) << output;
  fs::remove_all(out);
}

// The vocabulary check under mpirun: each process passes over its share of the shards
// before the first step (files f with f % processes == its rank), so no process reads every
// shard. A token past the vocabulary in rank 1's share (train_1.bin) fails the launch with
// one message naming the file, from rank 1 alone: rank 0 never read that file.
TEST(DistjaxTrain, UnderMpirunEachProcessChecksItsShareOfTheShards) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const fs::path dir = fs::temp_directory_path() / ("distjax_mpirun_vocab_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  distjax::data::write_llmc_shard((dir / "train_0.bin").string(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  distjax::data::write_llmc_shard((dir / "train_1.bin").string(), {1, 2, 3, 700, 5, 6, 7, 8, 9});
  distjax::data::write_llmc_shard((dir / "val.bin").string(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const auto [status, output] = run(
      "OMP_WAIT_POLICY=passive mpirun --allow-run-as-root --oversubscribe -np 2 " +
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/gpt_3d.toml --set distributed.tensor_parallel_size=1 "
      "--set distributed.pipeline_parallel_size=1 --set run.steps=1 --set data.seq_len=4 "
      "--set run.batch_size=2 --set run.eval_batches=1 --set model.layers=1 "
      "--set data.format=tokens --set model.vocab=512 --set data.train=" +
      (dir / "train_*.bin").string() + " --set data.val=" + (dir / "val.bin").string() +
      " --out " + (dir / "out").string());
  if (output.find("MPI backend") != std::string::npos &&
      output.find("not built") != std::string::npos)
    GTEST_SKIP() << "this build has no MPI backend: " << output;
  EXPECT_NE(status, 0) << output;
  const std::string message =
      "data.train holds token 700 (in " + (dir / "train_1.bin").string() + ")";
  std::size_t seen = 0;
  for (std::size_t at = output.find(message); at != std::string::npos;
       at = output.find(message, at + 1))
    ++seen;
  EXPECT_EQ(seen, 1u) << output;
  EXPECT_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  fs::remove_all(dir);
}

// The GPT with its sequences split over a "context" axis under mpirun (ring attention's
// transfers between processes), data 2 x context 2 on 4 ranks: the losses of the same run on
// the threads backend, to 1e-6 relative (f32 sums; measured equal to 1e-7).
// `distjax train <config> <sets>` for 4 steps on 4 devices, as 4 threads and as 4 processes
// under mpirun: the same losses (1e-6).
void expect_mpirun_trains_as_threads(const std::string& name, const std::string& config,
                                     const std::string& sets) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const fs::path base =
      fs::temp_directory_path() / ("distjax_mpirun_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(base);
  const std::string args =
      " train " + std::string(DISTJAX_SOURCE_DIR) + "/configs/" + config +
      " --set run.steps=4 --set run.log_every=1 --set run.eval_every=0 "
      "--set run.eval_batches=1 --set run.checkpoint_every=0 --set run.timeline=false "
      "--set model.layers=2 --set distributed.world_size=4 " + sets + " --out ";
  const auto [threads_status, threads_out] =
      run(std::string(DISTJAX_TOOL) + args + (base / "threads").string());
  ASSERT_EQ(threads_status, 0) << threads_out;
  const auto [status, output] =
      run("OMP_WAIT_POLICY=passive mpirun --allow-run-as-root --oversubscribe -np 4 " +
          std::string(DISTJAX_TOOL) + args + (base / "mpi").string());
  if (output.find("MPI backend") != std::string::npos &&
      output.find("not built") != std::string::npos)
    GTEST_SKIP() << "this build has no MPI backend: " << output;
  ASSERT_EQ(status, 0) << output;
  const auto losses = [](const fs::path& out) {
    std::vector<double> l;
    std::ifstream f(out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j["loss"].is_number()) l.push_back(j["loss"].get<double>());
    }
    return l;
  };
  const std::vector<double> want = losses(base / "threads"), got = losses(base / "mpi");
  ASSERT_EQ(want.size(), 4u) << threads_out;
  ASSERT_EQ(got.size(), want.size()) << output;
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "step " << i + 1;
  fs::remove_all(base);
}

TEST(DistjaxTrain, UnderMpirunTheContextSplitTrainsAsOnThreads) {
  expect_mpirun_trains_as_threads(
      "cp", "gpt_3d.toml",
      "--set distributed.tensor_parallel_size=1 --set distributed.pipeline_parallel_size=1 "
      "--set distributed.context_parallel_size=2");
}

// Expert parallelism: the counts' all_gather and the rows' ragged all_to_all between
// processes.
TEST(DistjaxTrain, UnderMpirunExpertParallelismTrainsAsOnThreads) {
  expect_mpirun_trains_as_threads("ep", "gpt_moe.toml",
                                  "--set distributed.expert_parallel_size=4");
}

// The exchange in chunks (several non-blocking all_to_alls in flight between processes,
// forward and backward) and the all-gather dispatcher.
TEST(DistjaxTrain, UnderMpirunEveryExpertDispatcherTrainsAsOnThreads) {
  expect_mpirun_trains_as_threads(
      "ep_chunks", "gpt_moe.toml",
      "--set distributed.expert_parallel_size=2 --set model.moe.exchange_chunks=3");
  expect_mpirun_trains_as_threads(
      "ep_gather", "gpt_moe.toml",
      "--set distributed.expert_parallel_size=4 --set model.moe.dispatcher=all_gather");
}

// The experts (and a shared expert) split over "model" beside an expert axis, the sequence
// split over "model" too: the MoE layers' gather and scatter of the sequence between
// processes.
TEST(DistjaxTrain, UnderMpirunExpertsSplitOverTheModelAxisTrainAsOnThreads) {
  expect_mpirun_trains_as_threads(
      "etp_sp", "gpt_moe.toml",
      "--set distributed.expert_parallel_size=2 --set distributed.tensor_parallel_size=2 "
      "--set model.moe.expert_tensor_parallel=true --set parallelism.sequence_parallel=true "
      "--set model.moe.shared_experts=1");
}
