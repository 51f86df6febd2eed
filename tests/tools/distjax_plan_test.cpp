// End to end: `distjax plan` prints the GPT-3 175B example of docs/plan.md and the meshes
// that fit, of those the gpt program runs; on configs/data_parallelism.toml its per-device
// memory is within 10% of what `distjax train` on the same config writes into summary.json;
// on every shipped config it runs, its activation estimate is at least the measured peak.
#include <gtest/gtest.h>

#include "tools/tool_run.hpp"
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::pair<int, std::string> run(const std::string& command) {
  return distjax::testing::run_tool(command);
}

}  // namespace

namespace {

// The bytes of the row `name` of the memory table ("  parameters   1628200   1.63 MB").
double row_bytes(const std::string& output, const std::string& name) {
  const std::size_t at = output.find("\n  " + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(output.substr(at + 3 + name.size()));
}

}  // namespace

TEST(DistjaxPlan, Gpt3OnSixtyFourDevices) {
  const auto [status, output] =
      run(std::string(DISTJAX_TOOL) + " plan " + DISTJAX_SOURCE_DIR +
          "/configs/plan_gpt3_175b.toml --recompute selective --state-bytes 2 --no-master-weights");
  ASSERT_EQ(status, 0) << output;
  // 174,604,259,328 with GPT-3's tied embeddings, plus the untied head (C x V) the gpt
  // program uses with a pipe axis.
  EXPECT_NE(output.find("175221817344 parameters"), std::string::npos) << output;
  EXPECT_NEAR(row_bytes(output, "parameters") / 1e9, 11.08, 0.01) << output;
  EXPECT_NEAR(row_bytes(output, "gradients") / 1e9, 11.08, 0.01) << output;
  EXPECT_NEAR(row_bytes(output, "optimizer state") / 1e9, 22.16, 0.01) << output;
  EXPECT_NEAR(row_bytes(output, "activations") / 1e9, 10.63, 0.01) << output;
  EXPECT_NEAR(row_bytes(output, "total") / 1e9, 54.95, 0.01) << output;
  EXPECT_NE(output.find("meshes of 64 devices that fit 80 GiB"), std::string::npos) << output;
  // The gpt program runs DP, ZeRO-1/2 and FSDP over "data", but no ZeRO-2 under a
  // pipeline: none of those is suggested.
  EXPECT_NE(output.find("data=2 model=8 pipe=4 FSDP"), std::string::npos) << output;
  EXPECT_NE(output.find("data=2 model=8 pipe=4 ZeRO-1"), std::string::npos) << output;
  EXPECT_NE(output.find("pipe=1 ZeRO-2"), std::string::npos) << output;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  data=", 0) == 0 && line.find(" ZeRO-2") != std::string::npos)
      EXPECT_NE(line.find(" pipe=1 "), std::string::npos) << line;
  EXPECT_EQ(output.find("refuses this config"), std::string::npos) << output;
  EXPECT_NE(output.find("model  reduce_scatter"), std::string::npos) << output;
}

TEST(DistjaxPlan, PredictsWhatTrainMeasures) {
  const fs::path out = fs::temp_directory_path() / "distjax_plan_test";
  fs::remove_all(out);
  const std::string config = std::string(DISTJAX_SOURCE_DIR) + "/configs/data_parallelism.toml";
  const auto [status, output] = run(std::string(DISTJAX_TOOL) + " train " + config +
                                    " --set run.steps=3 --out " + out.string());
  ASSERT_EQ(status, 0) << output;
  const auto summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  const auto& m = summary["memory_bytes_per_device"];
  const auto [plan_status, plan] = run(std::string(DISTJAX_TOOL) + " plan " + config);
  ASSERT_EQ(plan_status, 0) << plan;
  const std::pair<const char*, const char*> rows[] = {{"parameters", "parameters"},
                                                      {"gradients", "gradients"},
                                                      {"optimizer state", "optimizer_state"},
                                                      {"activations", "activations_peak"}};
  double measured_total = 0, predicted_total = 0;
  for (const auto& [row, key] : rows) {
    const double measured = m[key].get<double>(), predicted = row_bytes(plan, row);
    EXPECT_NEAR(predicted, measured, 0.10 * measured) << row << "\n" << plan;
    measured_total += measured;
    predicted_total += predicted;
  }
  EXPECT_NEAR(predicted_total, measured_total, 0.10 * measured_total) << plan;
  EXPECT_NEAR(row_bytes(plan, "total"), predicted_total, 1.0);
  fs::remove_all(out);
}

TEST(DistjaxPlan, AProgramWithoutAModelFailsNamingIt) {
  const auto [status, output] = run(std::string(DISTJAX_TOOL) + " plan " + DISTJAX_SOURCE_DIR +
                                    "/configs/pipeline_parallelism.toml");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("pp_classifier"), std::string::npos) << output;
}

// The activation estimate is never below what a run measures (summary.json's
// memory_bytes_per_device.activations_peak, device 0, the busiest under every shipped mesh:
// the first pipeline stage) on every shipped config: one step, one evaluation batch, no
// checkpoint or timeline, which change no per-step memory. Skipped, and said so: configs of
// programs without a planning model, and the planning-only GPT-3 175B. A config on token
// shards trains on the fortunes written as shards by `distjax data prepare`.
TEST(DistjaxPlan, EstimateIsAtLeastTheMeasuredPeakOfEveryShippedConfig) {
  const std::string sets =
      " --set run.steps=1 --set run.eval_batches=1 --set run.eval_every=0 "
      "--set run.checkpoint_every=0 --set run.timeline=false";
  std::vector<fs::path> configs;
  for (const auto& f : fs::directory_iterator(std::string(DISTJAX_SOURCE_DIR) + "/configs"))
    if (f.path().extension() == ".toml") configs.push_back(f.path());
  std::sort(configs.begin(), configs.end());
  const fs::path shards = fs::temp_directory_path() / "distjax_plan_peak_shards";
  fs::remove_all(shards);
  const auto [prepared, prepare_output] =
      run(std::string(DISTJAX_TOOL) + " data prepare --out " + shards.string());
  ASSERT_EQ(prepared, 0) << prepare_output;
  // Byte-level shards: vocabulary 256, no BPE tokenizer (a config's own shards may be BPE).
  const std::string on_shards = " --set data.train=" + (shards / "train_*.bin").string() +
                                " --set data.val=" + (shards / "val_*.bin").string() +
                                " --set model.vocab=256 --set data.tokenizer=";
  int compared = 0;
  for (const fs::path& config : configs) {
    const std::string name = config.stem().string();
    std::stringstream text;
    text << std::ifstream(config).rdbuf();
    const bool tokens = text.str().find("format = \"tokens\"") != std::string::npos;
    const auto [plan_status, plan] = run(std::string(DISTJAX_TOOL) + " plan " + config.string() +
                                         sets + (tokens ? on_shards : ""));
    if (plan_status != 0) {
      EXPECT_NE(plan.find("has no planning model"), std::string::npos) << name << "\n" << plan;
      std::printf("%-28s skipped: its program has no planning model\n", name.c_str());
      continue;
    }
    if (row_bytes(plan, "total") > 1e9) {
      std::printf("%-28s skipped: %.0f GB per device, planning only\n", name.c_str(),
                  row_bytes(plan, "total") / 1e9);
      continue;
    }
    const fs::path out = fs::temp_directory_path() / ("distjax_plan_peak_" + name);
    fs::remove_all(out);
    const auto [status, output] = run(std::string(DISTJAX_TOOL) + " train " + config.string() +
                                      sets + (tokens ? on_shards : "") + " --out " + out.string());
    ASSERT_EQ(status, 0) << name << "\n" << output;
    const auto summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
    ASSERT_TRUE(summary.contains("memory_bytes_per_device")) << name;
    const double measured = summary["memory_bytes_per_device"]["activations_peak"].get<double>();
    const double estimate = row_bytes(plan, "activations");
    std::printf("%-28s activations: estimate %10.0f, measured %10.0f, ratio %.3f\n", name.c_str(),
                estimate, measured, estimate / measured);
    EXPECT_GE(estimate, measured) << name << "\n" << plan;
    ++compared;
    fs::remove_all(out);
  }
  EXPECT_GE(compared, 7);
  fs::remove_all(shards);
}
