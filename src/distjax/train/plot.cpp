#include "distjax/train/plot.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace distjax::train {

namespace {

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && std::filesystem::exists(std::filesystem::path(d) / program)) return true;
  return false;
}

// gnuplot's string literal of a path or title (single quotes, '' escapes a quote).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string plot_loss_curve(const std::filesystem::path& metrics_jsonl,
                            const std::filesystem::path& png, const std::string& title) {
  std::ifstream in(metrics_jsonl);
  if (!in) return "cannot read " + metrics_jsonl.string();
  std::vector<std::pair<double, double>> train, eval;
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!rec.is_object() || !rec.contains("step")) continue;
    const double step = rec["step"].get<double>();
    if (rec.contains("loss") && rec["loss"].is_number()) train.emplace_back(step, rec["loss"].get<double>());
    if (rec.contains("eval_loss") && rec["eval_loss"].is_number())
      eval.emplace_back(step, rec["eval_loss"].get<double>());
  }
  if (train.empty()) return "no loss records in " + metrics_jsonl.string();
  if (!on_path("gnuplot")) return "gnuplot is not installed (Debian package gnuplot-nox)";
  const std::filesystem::path dir = png.parent_path().empty() ? "." : png.parent_path();
  const auto dat = dir / "loss_curve.dat", gp = dir / "loss_curve.gp";
  {
    std::ofstream d(dat);
    d << "# step train_loss\n";
    for (const auto& [s, l] : train) d << s << ' ' << l << '\n';
    d << "\n\n# step eval_loss\n";
    for (const auto& [s, l] : eval) d << s << ' ' << l << '\n';
  }
  {
    std::ofstream g(gp);
    g << "set terminal pngcairo size 900,540 enhanced font 'sans,11'\n"
      << "set output " << quoted(png.string()) << "\n"
      << "set title " << quoted(title.empty() ? "loss" : title) << "\n"
      << "set xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right\n"
      << "plot " << quoted(dat.string()) << " index 0 with lines lw 2 title 'train'";
    if (!eval.empty()) g << ", '' index 1 with linespoints lw 2 pt 7 title 'eval'";
    g << "\n";
  }
  const std::string cmd = "gnuplot " + quoted(gp.string()) + " 2>&1";
  std::string output;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) output += buf;
    if (pclose(p) != 0) return "gnuplot failed: " + output;
  } else {
    return "cannot run gnuplot";
  }
  if (!std::filesystem::exists(png)) return "gnuplot wrote no " + png.string() + ": " + output;
  return "";
}

}  // namespace distjax::train
