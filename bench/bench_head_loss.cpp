// The language-model head and its loss, forward and backward, on the current device: the
// chunked tensor::linear_cross_entropy_mean against the composed ops it replaces
// (mean(cross_entropy(matmul(x, w^T)))) at GPT-2's head shape (d 768, vocabulary 50304,
// tied table), bf16 products. Same run, same inputs, alternating repetitions.
//
//   head_loss_peak_gib          peak device memory of one forward + backward above what
//                               was live before it (value: chunked; baseline: composed)
//   head_loss_ms                median time of one forward + backward (value: chunked;
//                               baseline: composed)
//
// Usage: bench_head_loss [--rows N] [--reps R] [--chunk-mib M] [--device cpu|cuda]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

using namespace distjax;
using tensor::Tensor;

int main(int argc, char** argv) {
  CLI::App app{"head + cross-entropy: chunked against composed"};
  std::int64_t rows = 4096;
  int reps = 5;
  std::int64_t chunk_mib = 512;
  std::string device = "cpu";
  app.add_option("--rows", rows, "rows (batch x sequence)");
  app.add_option("--reps", reps, "repetitions of each side");
  app.add_option("--chunk-mib", chunk_mib, "f32 logits per chunk (MiB; the op's default 512)");
  app.add_option("--device", device, "cpu or cuda");
  CLI11_PARSE(app, argc, argv);
  const Device dev = device == "cuda" ? Device{DeviceKind::CUDA, 0} : Device::cpu();
  DeviceScope scope(dev);
  const std::int64_t k = 768, v = 50304;
  std::vector<float> xs(static_cast<std::size_t>(rows * k)), ws(static_cast<std::size_t>(v * k));
  random_uniform(Key::from_seed(1), xs.data(), rows * k, -1.f, 1.f);
  random_uniform(Key::from_seed(2), ws.data(), v * k, -0.05f, 0.05f);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7919) % v);
  const Tensor x = Tensor::from_vector(xs, {rows, k}).to(dev),
               w = Tensor::from_vector(ws, {v, k}).to(dev),
               labels = Tensor::from_vector(ids, {rows}).to(dev);
  auto step = [&](bool chunked) {
    Tensor xl = tensor::make_leaf(x), wl = tensor::make_leaf(w);
    const Tensor xb = tensor::astype(xl, DType::BF16), wb = tensor::astype(wl, DType::BF16);
    Tensor loss = chunked ? tensor::linear_cross_entropy_mean(xb, wb, labels, true, chunk_mib << 20)
                          : tensor::mean(tensor::cross_entropy(tensor::matmul(xb, wb, false, true),
                                                               labels));
    std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {xl, wl});
    return loss.item<float>() + g[0].to(Device::cpu()).to_vector<float>()[0];
  };
  std::vector<double> t[2];
  std::int64_t peak[2] = {0, 0};
  float check[2] = {0, 0};
  for (int r = 0; r < reps; ++r)
    for (int side = 0; side < 2; ++side) {
      const std::int64_t before = tensor::live_bytes(dev.kind);
      tensor::reset_peak_bytes(dev.kind);
      const auto t0 = bench::Clock::now();
      check[side] = step(side == 1);
      t[side].push_back(bench::seconds_since(t0));
      peak[side] = std::max(peak[side], tensor::peak_bytes(dev.kind) - before);
    }
  const double gib = 1 << 30;
  auto line = [&](const char* name, double value, double baseline, const char* unit) {
    nlohmann::json j{{"name", name},         {"value", value},          {"baseline", "composed"},
                     {"baseline_value", baseline}, {"ratio", value / baseline}, {"unit", unit},
                     {"rows", rows},         {"vocab", v},              {"d_model", k},
                     {"device", dev.str()},  {"precision", "bf16"}, {"chunk_mib", chunk_mib}};
    std::printf("%s\n", j.dump().c_str());
  };
  line("head_loss_peak_gib", peak[1] / gib, peak[0] / gib, "GiB");
  line("head_loss_ms", bench::median(t[1]) * 1e3, bench::median(t[0]) * 1e3, "ms");
  std::fprintf(stderr, "loss + dx[0]: chunked %.6f, composed %.6f\n", check[1], check[0]);
  return 0;
}
