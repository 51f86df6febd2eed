// Training-throughput benchmark: one step = forward + backward + optimizer update on a
// fixed synthetic batch (data loading not timed), median over steps after warm-up.
//   mlp: 784-512-512-10, ReLU, batch 128, Adam(lr 1e-3, b1 0.9, b2 0.999, eps 1e-8),
//        mean cross-entropy; built from tensor::linear / relu / cross_entropy (the
//        library's Classifier has one hidden layer, the benchmark MLP two). examples/s.
//   gpt: models::Transformer (4 layers, 4 heads, d 256, T 128, vocab 256, learned
//        positions, tied embedding, pre-norm, GELU tanh, LayerNorm eps 1e-5, no dropout),
//        batch 16, AdamW(lr 3e-4, b1 0.9, b2 0.95, eps 1e-8, wd 0.1 on every leaf). tokens/s.
// The PyTorch and JAX versions are bench/reference/{torch,jax}_train.py; bench/run.sh
// runs all of them in the same run and bench/summarize.py forms the ratios.
//
// Usage: bench_train [--threads N] [--seconds S] [--model mlp|gpt|all] [--phases]
//   --threads N  OpenMP threads for DistJax (default: the OpenMP default, all cores)
//   --phases     also time forward, forward+backward and the optimizer update alone
//   --tag T      append "_T" to the measurement names (run.sh: "omp_passive")
#include <CLI/CLI.hpp>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "bench_util.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

using namespace distjax;
using namespace distjax::bench;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  int threads = 0;  // 0 = OpenMP default
  double seconds = 5.0;
  std::string model = "all";
  bool phases = false;
  std::string tag;  // appended to the measurement names (e.g. "omp_passive")
};

Tensor normal_tensor(const Shape& shape, const Key& key, float std) {
  Tensor t = Tensor::empty(shape);
  random_normal(key, t.data<float>(), t.numel());
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= std;
  return t;
}

Tensor random_ints(const Shape& shape, const Key& key, std::int32_t n) {
  Tensor t = Tensor::empty(shape, DType::I32);
  std::int32_t* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int32_t>(key.bits(static_cast<std::uint64_t>(i))[0] % static_cast<std::uint32_t>(n));
  return t;
}

std::string thread_tag(const Options& o) {
  std::string t = o.threads > 0 ? "threads_" + std::to_string(o.threads) : "threads_default";
  return o.tag.empty() ? t : t + "_" + o.tag;
}

// Environment settings that change how OpenMP threads wait, recorded with each line.
json omp_env() {
  json e = json::object();
  for (const char* v : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_PROC_BIND"})
    if (const char* x = std::getenv(v)) e[v] = x;
  return e;
}

// ------------------------------------------------------------------ MLP

json bench_mlp(const Options& o, Writer& out, double peak) {
  const std::int64_t batch = 128;
  const std::vector<std::int64_t> sizes = {784, 512, 512, 10};
  TensorTree params;
  Key key = Key::from_seed(0);
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    const std::string name = "fc" + std::to_string(i + 1);
    params.set(name + "/kernel", normal_tensor({sizes[i], sizes[i + 1]}, key.fold_in(2 * i),
                                               1.f / std::sqrt(static_cast<float>(sizes[i]))));
    params.set(name + "/bias", Tensor::zeros({sizes[i + 1]}));
  }
  const Tensor x = normal_tensor({batch, 784}, key.fold_in(100), 1.f);
  const Tensor y = random_ints({batch}, key.fold_in(101), 10);

  auto loss_fn = [](const TensorTree& p, const Tensor& x, const Tensor& y) {
    Tensor h = tensor::relu(tensor::linear(x, p.at("fc1/kernel"), p.at("fc1/bias")));
    h = tensor::relu(tensor::linear(h, p.at("fc2/kernel"), p.at("fc2/bias")));
    Tensor logits = tensor::linear(h, p.at("fc3/kernel"), p.at("fc3/bias"));
    return tensor::mean(tensor::cross_entropy(logits, y));
  };
  optim::Adam opt({.learning_rate = optim::constant_schedule(1e-3), .b1 = 0.9, .b2 = 0.999, .eps = 1e-8});
  TensorTree state = opt.init(params);
  std::int64_t step = 0;
  float loss = 0.f;
  auto train_step = [&] {
    auto [l, grads] = autodiff::value_and_grad(loss_fn)(params, x, y);
    opt.update(params, grads, state, step++);
    loss = l.item<float>();
  };
  const auto times = time_calls(train_step, 5, 1, o.seconds, 10);
  const double med = median(times);
  const double n_params = static_cast<double>(params.num_elements());
  const double flops = 6.0 * n_params * batch;
  json j = line("distjax_mlp_train_examples_per_s_" + thread_tag(o), batch / med, "examples/s");
  j["framework"] = "distjax";
  j["model"] = "mlp";
  j["threads"] = omp_get_max_threads();
  j["step_time_median_s"] = med;
  j["step_time_min_s"] = minimum(times);
  j["steps"] = times.size();
  j["params"] = n_params;
  j["flops_per_step"] = flops;
  j["gflops"] = flops / med * 1e-9;
  j["peak_gflops"] = peak;
  j["fraction_of_peak"] = peak > 0 ? flops / med * 1e-9 / peak : 0.0;
  j["loss_final"] = loss;
  j["config"] = "784-512-512-10 ReLU, batch 128, Adam lr 1e-3";
  j["env"] = omp_env();
  out.write(j);
  return j;
}

// ------------------------------------------------------------------ GPT

json bench_gpt(const Options& o, Writer& out, double peak) {
  models::TransformerConfig cfg;
  cfg.vocab = 256;
  cfg.d_model = 256;
  cfg.num_layers = 4;
  cfg.num_heads = 4;
  cfg.mlp_ratio = 4;
  cfg.max_len = 128;
  cfg.learned_positions = true;
  cfg.tied_embeddings = true;
  cfg.dropout = 0.f;
  cfg.ln_eps = 1e-5f;
  const std::int64_t batch = 16, seq = 128;
  models::Transformer gpt(cfg);
  TensorTree params = gpt.init(Key::from_seed(0));
  const Tensor tokens = random_ints({batch, seq + 1}, Key::from_seed(1), 256);
  const Tensor inp = tensor::slice(tokens, 1, 0, seq).clone();
  const Tensor tgt = tensor::slice(tokens, 1, 1, seq + 1).clone();

  auto loss_fn = [&gpt](const TensorTree& p, const Tensor& inp, const Tensor& tgt) {
    Tensor logits = gpt.apply(p, inp, /*train=*/true, Key::from_seed(7));
    return tensor::mean(tensor::cross_entropy(logits, tgt));
  };
  optim::AdamW opt({.learning_rate = optim::constant_schedule(3e-4), .b1 = 0.9, .b2 = 0.95,
                    .eps = 1e-8, .weight_decay = 0.1, .decay_mask = {}});
  TensorTree state = opt.init(params);
  std::int64_t step = 0;
  float loss = 0.f;
  TensorTree last_grads;
  auto train_step = [&] {
    auto [l, grads] = autodiff::value_and_grad(loss_fn)(params, inp, tgt);
    opt.update(params, grads, state, step++);
    loss = l.item<float>();
    if (o.phases) last_grads = grads;
  };
  const auto times = time_calls(train_step, 2, 1, o.seconds, 5);
  const double med = median(times);
  const double tok = static_cast<double>(batch * seq);
  const double flops = gpt.flops_per_token(seq) * tok;
  json j = line("distjax_gpt_train_tokens_per_s_" + thread_tag(o), tok / med, "tokens/s");
  j["framework"] = "distjax";
  j["model"] = "gpt";
  j["threads"] = omp_get_max_threads();
  j["step_time_median_s"] = med;
  j["step_time_min_s"] = minimum(times);
  j["steps"] = times.size();
  j["params"] = gpt.num_params();
  j["matmul_params"] = gpt.num_matmul_params();
  j["flops_per_step"] = flops;
  j["gflops"] = flops / med * 1e-9;
  j["peak_gflops"] = peak;
  j["fraction_of_peak"] = peak > 0 ? flops / med * 1e-9 / peak : 0.0;
  j["loss_final"] = loss;
  j["config"] = "L4 H4 d256 T128 V256 B16, AdamW lr 3e-4 wd 0.1";
  j["env"] = omp_env();
  out.write(j);

  if (o.phases) {
    // Forward alone (grad off), forward + backward, and the optimizer update alone.
    auto fwd = [&] {
      tensor::NoGradGuard ng;
      Tensor l = loss_fn(params, inp, tgt);
      (void)l.item<float>();
    };
    auto fwd_bwd = [&] {
      auto [l, g] = autodiff::value_and_grad(loss_fn)(params, inp, tgt);
      (void)l.item<float>();
    };
    auto upd = [&] { opt.update(params, last_grads, state, step++); };
    const double s = std::max(1.0, o.seconds / 3);
    for (auto& [name, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"forward_nograd", fwd}, {"forward_backward", fwd_bwd}, {"optimizer_update", upd}}) {
      const double t = median(time_calls(fn, 1, 1, s, 3));
      json p = line("distjax_gpt_phase_" + name + "_ms_" + thread_tag(o), t * 1e3, "ms");
      p["threads"] = omp_get_max_threads();
      p["share_of_step"] = t / med;
      out.write(p);
    }
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App cli{"bench_train: training throughput against PyTorch and JAX"};
  cli.add_option("--threads", o.threads, "OpenMP threads");
  cli.add_option("--seconds", o.seconds, "time budget per measurement");
  cli.add_option("--model", o.model, "which model")->check(CLI::IsMember({"mlp", "gpt", "all"}));
  cli.add_flag("--phases", o.phases, "time the phases of a step");
  cli.add_option("--tag", o.tag, "tag of the output lines");
  CLI11_PARSE(cli, argc, argv);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const int threads = omp_get_max_threads();
  Writer out;
  const double peak = measure_peak_gflops(threads, 0.3);
  json p = line("peak_fp32_" + std::to_string(threads) + "threads_train_run" + (o.tag.empty() ? "" : "_" + o.tag),
                peak, "GFLOP/s");
  p["threads"] = threads;
  p["method"] = "AVX-512 FMA loop, 16 accumulators (measured in bench_train's process)";
  out.write(p);
  if (o.model == "all" || o.model == "mlp") bench_mlp(o, out, peak);
  if (o.model == "all" || o.model == "gpt") bench_gpt(o, out, peak);
  return 0;
}
