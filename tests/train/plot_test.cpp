// The loss-curve PNG: drawn by gnuplot from a metrics.jsonl, with a reason when it cannot be.
#include "distjax/train/plot.hpp"

#include <gtest/gtest.h>

#include <fstream>

using namespace distjax;

namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("distjax_plot_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST(PlotLossCurve, WritesAPng) {
  const auto dir = fresh_dir("png");
  {
    std::ofstream f(dir / "metrics.jsonl");
    for (int s = 1; s <= 5; ++s) f << "{\"step\": " << 10 * s << ", \"loss\": " << 3.0 / s << "}\n";
    f << "{\"step\": 50, \"eval_loss\": 0.9}\n";
  }
  const std::string why = train::plot_loss_curve(dir / "metrics.jsonl", dir / "loss_curve.png", "t");
  ASSERT_EQ(why, "");
  std::ifstream png(dir / "loss_curve.png", std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  EXPECT_GT(std::filesystem::file_size(dir / "loss_curve.png"), 1000u);
}

TEST(PlotLossCurve, SaysWhyThereIsNone) {
  const auto dir = fresh_dir("none");
  { std::ofstream f(dir / "metrics.jsonl"); f << "{\"step\": 1, \"accuracy\": 0.5}\n"; }
  EXPECT_NE(train::plot_loss_curve(dir / "metrics.jsonl", dir / "x.png").find("no loss records"),
            std::string::npos);
  EXPECT_NE(train::plot_loss_curve(dir / "missing.jsonl", dir / "x.png").find("cannot read"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "x.png"));
}
