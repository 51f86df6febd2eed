// End to end: `distjax plan` prints the GPT-3 175B example of docs/plan.md and the meshes
// that fit; on configs/data_parallelism.toml its per-device memory is within 10% of what
// `distjax train` on the same config writes into summary.json.
#include <gtest/gtest.h>

#include "tools/tool_run.hpp"
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
  EXPECT_NE(output.find("data=2 model=8 pipe=4 ZeRO-2"), std::string::npos) << output;
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
  EXPECT_NE(output.find("pipeline_parallelism"), std::string::npos) << output;
}
