// GEMM benchmark: DistJax's tensor::matmul / tensor::linear (cached oneDNN matmul
// primitives) against raw dnnl_sgemm at the same shapes on 1 thread, plus the
// machine's measured FP32 peak (AVX-512 FMA loop, 1 and 2 threads) in the same run.
//
// Shapes come from the benchmark MLP (batch 128) and GPT (B*T = 2048, d = 256):
// for each (M, K, N) we time the forward product x(M,K) @ W(K,N) ("nn") and both
// products of its backward: dX = dY(M,N) @ W^T ("nt") and dW = X^T @ dY ("tn").
// Both implementations are timed alternately in rounds, so machine noise hits both.
#include <CLI/CLI.hpp>
#include <dnnl.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/tensor.hpp"

using namespace distjax;
using namespace distjax::bench;
using tensor::Tensor;

namespace {

struct Problem {
  std::string variant;  // nn, nt, tn
  std::int64_t m, n, k;
  bool ta, tb;
};

Tensor random_tensor(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, shape);
}

// Times `ours` and `ref` alternately in `rounds` short rounds. Machine load changes
// slowly compared with a round, so each round's pair of medians is compared directly;
// the ratio (ref time / our time: > 1 means we are faster) is the median over rounds.
struct Paired {
  std::vector<double> t_ours, t_ref, ratios;
};
Paired time_paired(const std::function<void()>& ours, const std::function<void()>& ref, int inner,
                   double budget, int rounds = 16) {
  Paired p;
  for (int w = 0; w < 3; ++w) { ours(); ref(); }
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so neither always runs right after the other.
    auto first = time_calls(r % 2 ? ref : ours, 0, inner, budget / rounds, 2);
    auto second = time_calls(r % 2 ? ours : ref, 0, inner, budget / rounds, 2);
    auto& a = r % 2 ? second : first;
    auto& b = r % 2 ? first : second;
    p.t_ours.insert(p.t_ours.end(), a.begin(), a.end());
    p.t_ref.insert(p.t_ref.end(), b.begin(), b.end());
    p.ratios.push_back(median(b) / median(a));
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  double budget = 0.25;  // seconds per implementation per problem
  CLI::App cli{"bench_gemm: GEMM against oneDNN's and the FP32 peak"};
  cli.add_option("budget", budget, "seconds per implementation per problem");
  CLI11_PARSE(cli, argc, argv);
  Writer out;

  const double peak1 = measure_peak_gflops(1, 1.0);

  omp_set_num_threads(1);
  std::mt19937 rng(42);

  // (M, K, N) of the forward products.
  const std::vector<std::array<std::int64_t, 3>> shapes = {
      {128, 784, 512}, {128, 512, 512},   {128, 512, 10},    {2048, 256, 768},
      {2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {512, 512, 512}};

  double ratio_sum = 0.0, ratio_min = 1e9;
  int count = 0;
  for (const auto& shape : shapes) {
    // Copies, not a structured binding: clang before 16 cannot use one inside a lambda.
    const std::int64_t M = shape[0], K = shape[1], N = shape[2];
    // Forward: (M,K)@(K,N); dX: (M,N)@(K,N)^T -> (M,K); dW: (M,K)^T@(M,N) -> (K,N).
    const std::vector<Problem> problems = {{"nn", M, N, K, false, false},
                                           {"nt", M, K, N, false, true},
                                           {"tn", K, N, M, true, false}};
    for (const Problem& p : problems) {
      const Shape sa = p.ta ? Shape{p.k, p.m} : Shape{p.m, p.k};
      const Shape sb = p.tb ? Shape{p.n, p.k} : Shape{p.k, p.n};
      Tensor a = random_tensor(sa, rng), b = random_tensor(sb, rng);
      std::vector<float> c(static_cast<std::size_t>(p.m * p.n));
      const float* pa = a.data<float>();
      const float* pb = b.data<float>();
      auto run_ours = [&] {
        Tensor r = tensor::matmul(a, b, p.ta, p.tb);
        (void)r;
      };
      auto run_sgemm = [&] {
        dnnl_sgemm(p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', p.m, p.n, p.k, 1.f, pa, p.ta ? p.m : p.k, pb,
                   p.tb ? p.k : p.n, 0.f, c.data(), p.n);
      };
      // Check both compute the same product (guards against benchmarking the wrong thing).
      {
        Tensor r = tensor::matmul(a, b, p.ta, p.tb);
        run_sgemm();
        const float* pr = r.data<float>();
        double maxdiff = 0.0;
        for (std::size_t i = 0; i < c.size(); ++i)
          maxdiff = std::max(maxdiff, static_cast<double>(std::abs(pr[i] - c[i])));
        if (maxdiff > 1e-2) {
          std::fprintf(stderr, "bench_gemm: results differ (%g) at %s\n", maxdiff, p.variant.c_str());
          return 1;
        }
      }
      const double flops = 2.0 * p.m * p.n * p.k;
      const int inner = std::max(1, static_cast<int>(2e7 / flops));  // ~0.1-0.2 ms per rep minimum
      const Paired tp = time_paired(run_ours, run_sgemm, inner, budget);
      const auto& t_ours = tp.t_ours;
      const auto& t_ref = tp.t_ref;
      const double g_ours = flops / median(t_ours) * 1e-9;
      const double g_ref = flops / median(t_ref) * 1e-9;
      const std::string shape = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
      json j = line("gemm_" + shape + "_" + p.variant + "_gflops", g_ours, "GFLOP/s");
      compare(j, "dnnl_sgemm", g_ref, true);
      j["shape_mkn"] = shape;
      j["gemm_m_n_k"] = {p.m, p.n, p.k};
      j["trans_a"] = p.ta;
      j["trans_b"] = p.tb;
      j["threads"] = 1;
      j["fraction_of_peak"] = peak1 > 0 ? g_ours / peak1 : 0.0;
      j["baseline_fraction_of_peak"] = peak1 > 0 ? g_ref / peak1 : 0.0;
      j["ratio_of_medians"] = j["ratio"];
      j["ratio"] = median(tp.ratios);
      j["ratio_method"] = "median over 16 alternating rounds of (sgemm time / matmul time)";
      j["ratio_best"] = (flops / minimum(t_ours)) / (flops / minimum(t_ref));
      j["op"] = "tensor::matmul";
      out.write(j);
      const double r = j["ratio"].get<double>();
      ratio_sum += r;
      ratio_min = std::min(ratio_min, r);
      ++count;
    }

    // The dense layer's fused x @ W + b against sgemm without bias (bias is extra work for us).
    {
      Tensor x = random_tensor({M, K}, rng), w = random_tensor({K, N}, rng), bias = random_tensor({N}, rng);
      std::vector<float> c(static_cast<std::size_t>(M * N));
      auto run_ours = [&] {
        Tensor r = tensor::linear(x, w, bias);
        (void)r;
      };
      const float* px = x.data<float>();
      const float* pw = w.data<float>();
      auto run_sgemm = [&] {
        dnnl_sgemm('N', 'N', M, N, K, 1.f, px, K, pw, N, 0.f, c.data(), N);
      };
      const double flops = 2.0 * M * N * K;
      const int inner = std::max(1, static_cast<int>(2e7 / flops));
      const Paired tp = time_paired(run_ours, run_sgemm, inner, budget);
      const double g_ours = flops / median(tp.t_ours) * 1e-9;
      const double g_ref = flops / median(tp.t_ref) * 1e-9;
      const std::string shape = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
      json j = line("linear_bias_" + shape + "_gflops", g_ours, "GFLOP/s");
      compare(j, "dnnl_sgemm (no bias)", g_ref, true);
      j["shape_mkn"] = shape;
      j["threads"] = 1;
      j["fraction_of_peak"] = peak1 > 0 ? g_ours / peak1 : 0.0;
      j["ratio_of_medians"] = j["ratio"];
      j["ratio"] = median(tp.ratios);
      j["op"] = "tensor::linear (bias fused)";
      out.write(j);
    }
  }
  // The peak again after the GEMMs (best of both measurements): load from other
  // processes lowers a measurement, never raises it.
  const double peak1_end = measure_peak_gflops(1, 1.0);
  const double peak2 = std::max(measure_peak_gflops(2, 1.0), measure_peak_gflops(2, 0.5));
  const char* method = "AVX-512 FMA loop, 16 accumulators, best of ~1 ms repetitions";
  out.write(json{{"name", "peak_fp32_1thread"}, {"value", std::max(peak1, peak1_end)}, {"unit", "GFLOP/s"},
                 {"threads", 1}, {"method", method}, {"before_gemms", peak1}, {"after_gemms", peak1_end}});
  out.write(json{{"name", "peak_fp32_2threads"}, {"value", peak2}, {"unit", "GFLOP/s"},
                 {"threads", 2}, {"method", method}});
  json s = line("gemm_ratio_mean_vs_sgemm", ratio_sum / count, "ratio");
  s["ratio_min"] = ratio_min;
  s["count"] = count;
  s["target"] = 0.9;
  s["better"] = "higher";
  s["note"] = "arithmetic mean (and min) over the tensor::matmul vs dnnl_sgemm ratios above";
  out.write(s);
  return 0;
}
