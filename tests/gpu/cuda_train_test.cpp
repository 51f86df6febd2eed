// Golden runs of the CUDA backend (label "gpu"): the GPT of configs/train_gpt.toml trained
// 50 steps on the GPU and on the CPU from the same config (same data, initialisation and
// dropout keys) must follow the same losses: within 1e-4 relative in f32 (full f32
// products: TF32 is off by default), within 2% with bf16 matmuls (mixed_precision = "bf16",
// where the CPU's oneDNN and the GPU's cuBLASLt round and sum bf16 products differently).
//
// At a learning rate of 1e-3, not the config's 3e-3: measured on an H200 (2026-11-26), the
// two devices' losses agree to 1e-7 for 25 steps at either rate, but at 3e-3 the run turns
// chaotic once the warm-up ends, and rounding-level differences grow to 1e-4 (f32) and 4%
// (bf16) by step 48; at 1e-3 the largest differences over the 50 steps are 2.8e-7 (f32)
// and 7.4e-5 (bf16). The test asks whether the GPU computes the same training, not how
// fast a chaotic run amplifies the last bit.
// Without a GPU the tests skip, saying why (fail under DISTJAX_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distjax/app/train.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/tensor.hpp"
#include "gpu/gpu_test.hpp"

namespace {

using namespace distjax;
namespace fs = std::filesystem;


// The per-step training losses of a 50-step run of configs/train_gpt.toml on `device`.
std::vector<double> losses(const std::string& device, const std::string& precision) {
  const fs::path out = fs::temp_directory_path() /
                       ("distjax_golden_" + device + "_" + precision + "_" +
                        std::to_string(::getpid()));
  config::TrainConfig c = config::load_config(
      std::string(DISTJAX_SOURCE_DIR) + "/configs/train_gpt.toml",
      {"run.steps=50", "optimizer.lr=1e-3", "run.log_every=1", "run.eval_every=25", "run.eval_batches=2",
       "run.out_dir=" + out.string(), "distributed.device=" + device,
       "distributed.mixed_precision=" + precision});
  EXPECT_EQ(app::train(c), 0);
  std::vector<double> loss;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) loss.push_back(j["loss"].get<double>());
  }
  fs::remove_all(out);
  return loss;
}

void expect_same_losses(const std::string& precision, double rtol) {
  const std::vector<double> cpu = losses("cpu", precision);
  const std::vector<double> gpu = losses("cuda", precision);
  ASSERT_EQ(cpu.size(), 50u);
  ASSERT_EQ(gpu.size(), cpu.size());
  double worst = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double rel = std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, rtol) << "step " << i + 1 << ": " << gpu[i] << " on the GPU, " << cpu[i]
                         << " on the CPU";
  }
  std::printf("[golden %s] 50 steps: loss %.6f -> %.6f on the CPU, %.6f -> %.6f on the GPU; "
              "largest relative difference %.3g (tolerance %g)\n",
              precision.c_str(), cpu.front(), cpu.back(), gpu.front(), gpu.back(), worst, rtol);
}

TEST(CudaTrain, GptF32FollowsTheCpuLosses) {
  SKIP_WITHOUT_GPU();
  expect_same_losses("no", 1e-4);
}

TEST(CudaTrain, GptBf16FollowsTheCpuLosses) {
  SKIP_WITHOUT_GPU();
  expect_same_losses("bf16", 2e-2);
}

}  // namespace
