// The main job's checkpoints end to end: `distjax train configs/gpt_3d.toml` (GPT on a
// (data 2, model 2, pipe 2) mesh) killed with SIGKILL after a checkpoint and resumed with
// --resume logs exactly the losses of a run that was never stopped; `distjax ckpt
// inspect` lists the saved tensors. And what --resume, --resume=auto and --overwrite do
// with a directory that holds checkpoints or none (the small one-device train_gpt).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "distjax/data/text_corpus.hpp"
#include "distjax/data/token_shards.hpp"
#include "tools/tool_run.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> job_args(const fs::path& out, bool resume,
                                  const std::vector<std::string>& more = {}) {
  std::vector<std::string> a = {DISTJAX_TOOL,
                                "train",
                                std::string(DISTJAX_SOURCE_DIR) + "/configs/gpt_3d.toml",
                                "--set",
                                "run.steps=24",
                                "--set",
                                "run.log_every=2",
                                "--set",
                                "run.eval_every=0",
                                "--set",
                                "run.checkpoint_every=8",
                                "--set",
                                "run.timeline=false",
                                "--out",
                                out.string()};
  a.insert(a.end(), more.begin(), more.end());
  if (resume) a.push_back("--resume");
  return a;
}

// Whether metrics.jsonl holds a whole record of `step`.
bool logged(const fs::path& metrics, int step) {
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("step") && j["step"] == step) return true;
  }
  return false;
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
    for (const std::string& s : args)
      argv.push_back(const_cast<char*>(s.c_str()));
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
    if (j.contains("loss") && j["loss"].is_number())
      out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

// The main job (with `more` arguments) SIGKILLed after its step-8 checkpoint and resumed
// logs the losses of the run that was never stopped, bit for bit, each step once.
void expect_killed_run_resumes_exactly(const fs::path& base, const std::vector<std::string>& more) {
  // The run that is never stopped.
  ASSERT_EQ(wait_for(start(job_args(base / "whole", false, more), base / "whole.log")), 0)
      << slurp(base / "whole.log");
  const std::map<int, double> want = losses(base / "whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 12u) << slurp(base / "whole.log");

  // The same run, SIGKILLed once it has logged step 12, past its step-8 checkpoint: the
  // resumed run does steps 9 to 12 again.
  const pid_t pid = start(job_args(base / "cut", false, more), base / "cut.log");
  const fs::path ckpt = base / "cut" / "checkpoints" / "step_00000008";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!logged(base / "cut" / "metrics.jsonl", 12) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGKILL);
  const int killed = wait_for(pid);
  ASSERT_TRUE(fs::exists(ckpt / "index.json")) << slurp(base / "cut.log");
  const std::map<int, double> before = losses(base / "cut" / "metrics.jsonl");
  ASSERT_LT(before.size(), want.size())
      << "the run finished before it was killed (status " << killed << "): nothing was resumed";

  ASSERT_EQ(wait_for(start(job_args(base / "cut", true, more), base / "resumed.log")), 0)
      << slurp(base / "resumed.log");
  const std::string resumed = slurp(base / "resumed.log");
  const auto at = resumed.find("Resumed from");
  ASSERT_NE(at, std::string::npos) << resumed;
  const int from = std::stoi(resumed.substr(resumed.find("at step ", at) + 8));
  EXPECT_GE(from, 8);
  ASSERT_GT(before.rbegin()->first, from) << "nothing was logged past the checkpoint";
  // The killed run's records past the checkpoint were dropped: every step's train record
  // (and the final evaluation's) is there once.
  std::map<std::pair<int, bool>, int> count;  // (step, evaluation) -> records
  {
    std::ifstream f(base / "cut" / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      ++count[{j["step"].get<int>(), !j.contains("loss")}];
    }
  }
  for (const auto& [key, n] : count)
    EXPECT_EQ(n, 1) << (key.second ? "evaluation" : "step") << " " << key.first << " logged " << n
                    << " times";
  const std::map<int, double> got = losses(base / "cut" / "metrics.jsonl");
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << "no loss logged at step " << step;
    EXPECT_EQ(got.at(step), loss) << "step " << step;  // bit for bit
  }
}

}  // namespace

TEST(DistjaxResume, KilledMainJobResumesExactly) {
  const fs::path base = fs::temp_directory_path() / ("distjax_resume_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  expect_killed_run_resumes_exactly(base, {});
  if (HasFatalFailure()) return;

  // distjax ckpt inspect names the mesh and the tensors.
  const fs::path inspect_log = base / "inspect.log";
  ASSERT_EQ(
      wait_for(start({DISTJAX_TOOL, "ckpt", "inspect", (base / "cut" / "checkpoints").string()},
                     inspect_log)),
      0);
  const std::string listing = slurp(inspect_log);
  EXPECT_NE(listing.find("step 24"), std::string::npos) << listing;
  EXPECT_NE(listing.find("(\"data\"=2, \"model\"=2, \"pipe\"=2)"), std::string::npos) << listing;
  EXPECT_NE(listing.find("params/blocks/3/mlp/fc2/kernel"), std::string::npos) << listing;
  fs::remove_all(base);
}

// The same on token shards (data.format = "tokens": the fortunes as llm.c shards of byte
// tokens): the resumed run reads the tokens the uninterrupted one read.
TEST(DistjaxResume, KilledTokensRunResumesExactly) {
  const fs::path base =
      fs::temp_directory_path() / ("distjax_resume_tokens_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base / "shards");
  namespace data = distjax::data;
  const data::ByteCorpus corpus = data::load_fortunes(data::kFortunesDir, 0.05);
  data::write_llmc_shard((base / "shards" / "train_000.bin").string(),
                         {corpus.train.begin(), corpus.train.end()});
  data::write_llmc_shard((base / "shards" / "val_000.bin").string(),
                         {corpus.validation.begin(), corpus.validation.end()});
  expect_killed_run_resumes_exactly(
      base, {"--set", "data.format=tokens", "--set",
             "data.train=" + (base / "shards" / "train_*.bin").string(), "--set",
             "data.val=" + (base / "shards" / "val_*.bin").string(), "--set", "model.vocab=256"});
  EXPECT_NE(slurp(base / "resumed.log").find("bits per token"), std::string::npos)
      << slurp(base / "resumed.log");
  fs::remove_all(base);
}

namespace {

// The main job's config for 6 steps on a (data, model, pipe) mesh into `out`: every loss
// logged, a checkpoint at step 4, no evaluation during the run; `more` appended.
std::vector<std::string> six_steps_on(const fs::path& out, int data, int model, int pipe,
                                      const std::vector<std::string>& more = {}) {
  std::vector<std::string> a = {DISTJAX_TOOL,
                                "train",
                                std::string(DISTJAX_SOURCE_DIR) + "/configs/gpt_3d.toml",
                                "--set",
                                "run.steps=6",
                                "--set",
                                "run.log_every=1",
                                "--set",
                                "run.eval_every=0",
                                "--set",
                                "run.eval_batches=1",
                                "--set",
                                "run.checkpoint_every=4",
                                "--set",
                                "run.timeline=false",
                                "--set",
                                "distributed.world_size=" + std::to_string(data * model * pipe),
                                "--set",
                                "distributed.tensor_parallel_size=" + std::to_string(model),
                                "--set",
                                "distributed.pipeline_parallel_size=" + std::to_string(pipe),
                                "--out",
                                out.string()};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

// A checkpoint of the (data 2, model 2, pipe 2) GPT resumes on meshes without a pipe axis
// (8 x 1 x 1, 4 x 2 x 1) and on one device: the parameter tree is the config's, not the
// mesh's, and the next step's loss is the uninterrupted run's within 1e-6 (the sums run in
// another order: measured up to 3.6e-7).
TEST(DistjaxResume, CheckpointMovesBetweenMeshesWithAndWithoutAPipe) {
  const fs::path base = fs::temp_directory_path() / ("distjax_remesh_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  auto args = [](const fs::path& out, int data, int model, int pipe) {
    return six_steps_on(out, data, model, pipe);
  };
  ASSERT_EQ(wait_for(start(args(base / "whole", 2, 2, 2), base / "whole.log")), 0)
      << slurp(base / "whole.log");
  const std::map<int, double> want = losses(base / "whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u) << slurp(base / "whole.log");
  for (const auto& [data, model] : {std::pair{8, 1}, std::pair{4, 2}, std::pair{1, 1}}) {
    std::string name = "data";
    name.append(std::to_string(data)).append("_model").append(std::to_string(model));
    const fs::path out = base / name;
    fs::create_directories(out / "checkpoints");
    fs::copy(base / "whole" / "checkpoints" / "step_00000004",
             out / "checkpoints" / "step_00000004", fs::copy_options::recursive);
    std::vector<std::string> a = args(out, data, model, 1);
    a.push_back("--resume");
    const fs::path log = base / (name + ".log");
    ASSERT_EQ(wait_for(start(a, log)), 0) << slurp(log);
    EXPECT_NE(slurp(log).find("at step 4"), std::string::npos) << slurp(log);
    const std::map<int, double> got = losses(out / "metrics.jsonl");
    ASSERT_TRUE(got.count(5)) << slurp(log);
    EXPECT_NEAR(got.at(5), want.at(5), distjax::testing::loss_bound(1e-6)) << name;
  }
  fs::remove_all(base);
}

// data.order = "epochs": each data replica reads only its rows of the global batch, so the
// same global batches on (2, 2, 2) and on (8, 1, 1) give the same losses (within the sums'
// order); resumed from the (2, 2, 2) run's step-4 checkpoint, on its own mesh the losses are
// the uninterrupted run's bit for bit and on (8, 1, 1) within 1e-6: the order follows from
// the step.
TEST(DistjaxResume, EpochOrderReadsOneStreamOnEveryMeshAndAcrossAResume) {
  const fs::path base = fs::temp_directory_path() / ("distjax_epochs_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  auto args = [](const fs::path& out, int data, int model, int pipe) {
    return six_steps_on(out, data, model, pipe, {"--set", "data.order=epochs"});
  };
  ASSERT_EQ(wait_for(start(args(base / "whole", 2, 2, 2), base / "whole.log")), 0)
      << slurp(base / "whole.log");
  EXPECT_NE(slurp(base / "whole.log").find("Order: epochs of"), std::string::npos)
      << slurp(base / "whole.log");
  const std::map<int, double> want = losses(base / "whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u) << slurp(base / "whole.log");
  ASSERT_EQ(wait_for(start(args(base / "data8", 8, 1, 1), base / "data8.log")), 0)
      << slurp(base / "data8.log");
  const std::map<int, double> data8 = losses(base / "data8" / "metrics.jsonl");
  for (const auto& [step, loss] : want)
    EXPECT_NEAR(data8.at(step), loss, 1e-5) << "step " << step << " on (8, 1, 1)";
  for (const auto& [name, data, model, pipe, tolerance] :
       {std::tuple{"same", 2, 2, 2, 0.0}, std::tuple{"other", 8, 1, 1, 1e-6}}) {
    const fs::path out = base / name;
    fs::create_directories(out / "checkpoints");
    fs::copy(base / "whole" / "checkpoints" / "step_00000004",
             out / "checkpoints" / "step_00000004", fs::copy_options::recursive);
    std::vector<std::string> a = args(out, data, model, pipe);
    a.push_back("--resume");
    const fs::path log = base / (std::string(name) + ".log");
    ASSERT_EQ(wait_for(start(a, log)), 0) << slurp(log);
    const std::map<int, double> got = losses(out / "metrics.jsonl");
    for (int step : {5, 6}) {
      ASSERT_TRUE(got.count(step)) << slurp(log);
      if (tolerance == 0.0) {
        EXPECT_EQ(got.at(step), want.at(step)) << name << " step " << step;
      } else {
        EXPECT_NEAR(got.at(step), want.at(step), tolerance) << name << " step " << step;
      }
    }
  }
  fs::remove_all(base);
}

// Packed documents (the fortunes end at their "%" lines: data.eot = 37) through every
// parallelism of the main job's mesh, the pipeline included: the same losses as data
// parallelism alone, and not those of the windows unpacked.
TEST(DistjaxResume, PackedDocumentsTrainAlikeOnEveryMeshPipelinesIncluded) {
  const fs::path base = fs::temp_directory_path() / ("distjax_packed_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  auto args = [](const fs::path& out, int data, int model, int pipe, bool packed) {
    return six_steps_on(out, data, model, pipe,
                        packed ? std::vector<std::string>{"--set", "data.eot=37", "--set",
                                                          "data.document_attention=true"}
                               : std::vector<std::string>{});
  };
  std::map<std::string, std::map<int, double>> got;
  for (const auto& [name, data, model, pipe, packed] :
       {std::tuple{"whole", 2, 2, 2, true}, std::tuple{"data8", 8, 1, 1, true},
        std::tuple{"unpacked", 2, 2, 2, false}}) {
    const fs::path log = base / (std::string(name) + ".log");
    ASSERT_EQ(wait_for(start(args(base / name, data, model, pipe, packed), log)), 0) << slurp(log);
    got[name] = losses(base / name / "metrics.jsonl");
    ASSERT_EQ(got[name].size(), 6u) << slurp(log);
  }
  for (const auto& [step, loss] : got["whole"]) {
    EXPECT_NEAR(got["data8"].at(step), loss, 1e-5) << "step " << step << " on (8, 1, 1)";
    EXPECT_GT(std::abs(got["unpacked"].at(step) - loss), 1e-4) << "step " << step;
  }
  fs::remove_all(base);
}

// ------------------------------------------------------------ --resume, --resume=auto, --overwrite

namespace {

// `distjax train configs/train_gpt.toml` shrunk to a few seconds: `steps` steps of a
// one-block GPT, a checkpoint every step, into `out`; `flags` appended.
std::pair<int, std::string> small_run(const fs::path& out, int steps, const std::string& flags) {
  return distjax::testing::run_tool(
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/train_gpt.toml --set run.steps=" + std::to_string(steps) +
      " --set run.checkpoint_every=1 --set run.log_every=1 --set run.eval_every=0 "
      "--set run.eval_batches=1 --set model.layers=1 --set model.d_model=32 --out " +
      out.string() + " " + flags);
}

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p;
}

}  // namespace

TEST(DistjaxResume, ResumeWithoutACheckpointSaysWhereItLooked) {
  const fs::path out = fresh_dir("distjax_resume_none");
  const std::string ckpt = (out / "checkpoints").string();
  {  // Nothing there at all.
    const auto [status, output] = small_run(out, 2, "--resume");
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find("[Checkpointer] no checkpoint to resume from in \"" + ckpt + "\""),
              std::string::npos)
        << output;
    EXPECT_NE(output.find("does not exist"), std::string::npos) << output;
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "it trained anyway";
  }
  {  // A step directory whose index.json is gone: not a checkpoint.
    ASSERT_EQ(small_run(out, 1, "").first, 0);
    fs::remove(out / "checkpoints" / "step_00000001" / "index.json");
    const auto [status, output] = small_run(out, 2, "--resume");
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find("no checkpoint to resume from in \"" + ckpt + "\""), std::string::npos)
        << output;
    EXPECT_NE(output.find("step_00000001 has no index.json"), std::string::npos) << output;
  }
  fs::remove_all(out);
}

TEST(DistjaxResume, AutoResumesWhenThereIsACheckpointAndStartsFreshOtherwise) {
  const fs::path out = fresh_dir("distjax_resume_auto");
  const auto [status, output] = small_run(out, 2, "--resume=auto");
  ASSERT_EQ(status, 0) << output;
  EXPECT_EQ(output.find("Resumed from"), std::string::npos) << output;
  const auto [status2, output2] = small_run(out, 3, "--resume=auto");
  ASSERT_EQ(status2, 0) << output2;
  EXPECT_NE(output2.find("Resumed from " + (out / "checkpoints").string() + " at step 2"),
            std::string::npos)
      << output2;
  // The config key says the same ("auto" in TOML).
  const auto [status3, output3] = small_run(out, 4, "--set run.resume=auto");
  ASSERT_EQ(status3, 0) << output3;
  EXPECT_NE(output3.find("at step 3"), std::string::npos) << output3;
  fs::remove_all(out);
}

TEST(DistjaxResume, AFreshRunRefusesADirectoryWithCheckpoints) {
  const fs::path out = fresh_dir("distjax_resume_overwrite");
  const fs::path ckpt = out / "checkpoints";
  ASSERT_EQ(small_run(out, 2, "").first, 0);
  ASSERT_TRUE(fs::exists(ckpt / "step_00000002" / "index.json"));
  const auto [status, output] = small_run(out, 1, "");
  EXPECT_EQ(status, 1) << output;
  EXPECT_NE(output.find(std::string("\"") + ckpt.string() +
                        "\" holds checkpoints up to step 2: pass --resume "
                        "to continue, --resume=auto, or --overwrite to start afresh"),
            std::string::npos)
      << output;
  EXPECT_TRUE(fs::exists(ckpt / "step_00000002" / "index.json")) << "the refusal removed them";
  // --overwrite starts afresh: the old steps are gone, `latest` names the new run's.
  const auto [status2, output2] = small_run(out, 1, "--overwrite");
  ASSERT_EQ(status2, 0) << output2;
  EXPECT_FALSE(fs::exists(ckpt / "step_00000002"));
  EXPECT_TRUE(fs::exists(ckpt / "step_00000001" / "index.json"));
  std::ifstream latest(ckpt / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000001");
  // --overwrite and --resume contradict each other.
  const auto [status3, output3] = small_run(out, 2, "--overwrite --resume");
  EXPECT_EQ(status3, 1) << output3;
  EXPECT_NE(output3.find("run.overwrite"), std::string::npos) << output3;
  fs::remove_all(out);
}

namespace {

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

// Resuming a run that had finished (its checkpoint at run.steps, or past a lowered
// run.steps) trains nothing, says so, and leaves metrics.jsonl, summary.json and the
// checkpoints as they were (it used to log a second evaluation and rewrite summary.json
// with zero throughput and no train metrics).
TEST(DistjaxResume, ResumingAFinishedRunChangesNothing) {
  const fs::path out = fresh_dir("distjax_resume_finished");
  ASSERT_EQ(small_run(out, 2, "").first, 0);
  const std::string metrics = contents(out / "metrics.jsonl");
  const std::string summary = contents(out / "summary.json");
  ASSERT_NE(summary.find("\"train_loss\""), std::string::npos) << summary;
  for (int steps : {2, 1}) {
    SCOPED_TRACE("run.steps = " + std::to_string(steps));
    const auto [status, output] = small_run(out, steps, "--resume");
    EXPECT_EQ(status, 0) << output;
    EXPECT_NE(
        output.find("Nothing to train: the checkpoint is at step 2 and the run ends at step " +
                    std::to_string(steps)),
        std::string::npos)
        << output;
    EXPECT_EQ(output.find("done: "), std::string::npos) << output;
    EXPECT_EQ(contents(out / "metrics.jsonl"), metrics);
    EXPECT_EQ(contents(out / "summary.json"), summary);
    EXPECT_FALSE(fs::exists(out / "checkpoints" / "step_00000003"));
  }
  fs::remove_all(out);
}

// The learning-rate schedule spans the run: resuming with another run.steps changes the
// rate from the resumed step on, which is allowed but said, with the rate before and after;
// a resume with the same settings says nothing.
TEST(DistjaxResume, ResumingWithAnotherScheduleSaysSo) {
  const fs::path out = fresh_dir("distjax_resume_schedule");
  ASSERT_EQ(small_run(out, 3, "--set run.checkpoint_every=2").first, 0);
  fs::remove_all(out / "checkpoints" / "step_00000003");  // as if it stopped after step 2
  const auto [status, output] = small_run(out, 3, "--resume");
  ASSERT_EQ(status, 0) << output;
  EXPECT_EQ(output.find("Warning: the checkpoint's run had other schedule settings"),
            std::string::npos)
      << output;
  const auto [status2, output2] = small_run(out, 6, "--resume");
  ASSERT_EQ(status2, 0) << output2;
  EXPECT_NE(output2.find("Warning: the checkpoint's run had other schedule settings (run.steps "
                         "3 -> 6): the learning rate from step 3 follows this run's schedule ("),
            std::string::npos)
      << output2;
  fs::remove_all(out);
}
