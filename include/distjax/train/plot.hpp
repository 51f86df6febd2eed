// Loss curves: a PNG of a run's metrics.jsonl drawn by gnuplot (Debian's gnuplot-nox).
#pragma once

#include <filesystem>
#include <string>

namespace distjax::train {

/// Draws the train loss (and the eval loss, when recorded) of `metrics_jsonl` against the
/// step into `png` with gnuplot: a data file and a script are written next to the PNG
/// (loss_curve.dat, loss_curve.gp) and `gnuplot` is run on them. Returns an empty string
/// on success, else why there is no PNG (no gnuplot on PATH, no records, gnuplot failed).
///
///   std::string why = train::plot_loss_curve("runs/gpt/metrics.jsonl", "runs/gpt/loss_curve.png");
std::string plot_loss_curve(const std::filesystem::path& metrics_jsonl,
                            const std::filesystem::path& png, const std::string& title = "");

}  // namespace distjax::train
