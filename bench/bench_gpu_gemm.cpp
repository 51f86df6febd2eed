// The GEMMs of one GPT-2 124M training step (batch B, T 1024: each linear layer's forward,
// its input gradient and its weight gradient, the tied head's too) through DistJax's matmul
// on the GPU against raw cuBLASLt calls (the same bf16 operands, f32 outputs and layouts,
// the heuristic's first algorithm, a preallocated output): the cost of the op layer
// (autodiff bookkeeping, allocation, plan lookup) over the library it calls. One JSON line
// per shape (gpu_gemm_vs_cublas, value = raw time / DistJax time, goal >= 0.95) and one
// for the whole step's GEMMs (gpu_gemm_vs_cublas_step), each product weighted by how often a
// step runs it: a block's four layers 12 times, the tied head once. The products are plain
// (bf16 operands, f32 output, no epilogue): the step's bias, GELU and bias-gradient
// epilogues are not in either side. DISTJAX_BENCH_OUT appends the lines.
//   bench_gpu_gemm [--batch 16] [--reps 20]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/tensor.hpp"

#ifdef DISTJAX_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

namespace {

using namespace distjax;
using tensor::Tensor;

#ifdef DISTJAX_HAVE_CUDA

void emit(const nlohmann::json& j) {
  const std::string line = j.dump();
  std::printf("%s\n", line.c_str());
  if (const char* path = std::getenv("DISTJAX_BENCH_OUT")) std::ofstream(path, std::ios::app) << line << "\n";
}

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));             \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_LT(x)                                                                    \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s failed: %s\n", #x, cublasLtGetStatusString(s_));        \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// One row-major product C (m x n, f32) = op(A) op(B) with bf16 operands, straight through
// cuBLASLt (C^T = op(B)^T op(A)^T in its column-major terms).
struct RawGemm {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  static constexpr std::size_t kWs = std::size_t{32} << 20;

  RawGemm(std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb) {
    CHECK_LT(cublasLtCreate(&h));
    CHECK_CUDA(cudaMalloc(&ws, kWs));
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    // cuBLASLt's A = the table's B (stored k x n, or n x k when tb), its B = the table's A.
    CHECK_LT(tb ? cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k)
                : cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n));
    CHECK_LT(ta ? cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, m, k, m)
                : cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws_bytes = kWs;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &r, &found));
    if (found == 0) {
      std::fprintf(stderr, "no cuBLASLt algorithm\n");
      std::exit(1);
    }
    algo = r.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(const void* a, const void* b, float* c, cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    CHECK_LT(cublasLtMatmul(h, desc, &one, b, la, a, lb, &zero, c, lc, c, lc, &algo, ws, kWs, s));
  }
  ~RawGemm() {
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(ws);
    cublasLtDestroy(h);
  }
};

// Milliseconds per call of fn: `reps` calls between two events on the thread's stream,
// after 3 warm-up calls.
template <class F>
double time_ms(F fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, cudaStreamPerThread));
  for (int i = 0; i < reps; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b, cudaStreamPerThread));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

#endif

}  // namespace

int main(int argc, char** argv) {
  if (tensor::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu_gemm: no GPU: %s\n", tensor::cuda_unavailable_reason().c_str());
    return 1;
  }
#ifdef DISTJAX_HAVE_CUDA
  std::int64_t batch = 16;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--batch") batch = std::stoll(argv[i + 1]);
    else if (k == "--reps") reps = std::stoi(argv[i + 1]);
  }
  const Device gpu{DeviceKind::CUDA, 0};
  DeviceScope on(gpu);
  tensor::NoGradGuard no_grad;
  const std::int64_t rows = batch * 1024;
  struct Layer {
    const char* name;
    std::int64_t k, n;  // forward: (rows, k) x (k, n)
    bool weight_transposed;  // the tied head multiplies by wte^T (n, k)
    int per_step;            // how many times a step runs each of its products
  };
  constexpr int kBlocks = 12;
  const std::vector<Layer> layers = {
      {"qkv", 768, 2304, false, kBlocks},  {"attn_proj", 768, 768, false, kBlocks},
      {"fc", 768, 3072, false, kBlocks},   {"fc2", 3072, 768, false, kBlocks},
      {"lm_head", 768, 50304, true, 1}};
  double ours_total = 0, raw_total = 0;
  // Random bf16 operands: at most 1024 random rows made on the host, repeated on the GPU
  // (the head's operands hold 1.6 billion elements: drawing each on the host took most of
  // the benchmark's time).
  auto bf16 = [](const Shape& s, std::uint64_t seed) {
    const std::int64_t block = std::min<std::int64_t>(s[0], 1024);
    const Shape bs{block, s[1]};
    std::vector<float> v(static_cast<std::size_t>(numel(bs)));
    random_uniform(Key::from_seed(seed), v.data(), numel(bs), -1.f, 1.f);
    const Tensor rows = tensor::astype(
        Tensor::from_vector(v, bs, Device::cpu()).to(Device{DeviceKind::CUDA, 0}), DType::BF16);
    if (block == s[0]) return rows;
    const std::vector<Tensor> copies(static_cast<std::size_t>(s[0] / block), rows);
    Tensor whole = tensor::concat(copies, 0);
    const std::int64_t rest = s[0] % block;
    if (rest > 0) whole = tensor::concat({whole, tensor::slice(rows, 0, 0, rest)}, 0);
    return whole;
  };
  for (const Layer& l : layers) {
    // The three products of a linear layer: y = x w, dx = dy w^T, dw = x^T dy.
    struct Product {
      std::string what;
      std::int64_t m, n, k;
      bool ta, tb;
      Shape sa, sb;
    };
    const Shape w_shape = l.weight_transposed ? Shape{l.n, l.k} : Shape{l.k, l.n};
    const std::vector<Product> products = {
        {"forward", rows, l.n, l.k, false, l.weight_transposed, {rows, l.k}, w_shape},
        {"input_grad", rows, l.k, l.n, false, !l.weight_transposed, {rows, l.n}, w_shape},
        {"weight_grad", l.k, l.n, rows, true, false, {rows, l.k}, {rows, l.n}},
    };
    for (const Product& p : products) {
      const Tensor a = bf16(p.sa, 1), b = bf16(p.sb, 2);
      const double ours = time_ms([&] { (void)tensor::matmul(a, b, p.ta, p.tb); }, reps);
      float* c = nullptr;
      CHECK_CUDA(cudaMalloc(&c, static_cast<std::size_t>(p.m * p.n) * sizeof(float)));
      RawGemm raw(p.m, p.n, p.k, p.ta, p.tb);
      const double theirs =
          time_ms([&] { raw.run(a.raw_data(), b.raw_data(), c, cudaStreamPerThread); }, reps);
      CHECK_CUDA(cudaFree(c));
      ours_total += l.per_step * ours;
      raw_total += l.per_step * theirs;
      const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
      emit({{"name", "gpu_gemm_vs_cublas"}, {"value", theirs / ours}, {"unit", "ratio"},
            {"layer", l.name}, {"product", p.what}, {"m", p.m}, {"n", p.n}, {"k", p.k},
            {"ta", p.ta}, {"tb", p.tb}, {"per_step", l.per_step}, {"distjax_ms", ours},
            {"cublaslt_ms", theirs},
            {"distjax_tflops", flops / ours * 1e-9}, {"cublaslt_tflops", flops / theirs * 1e-9}});
    }
  }
  emit({{"name", "gpu_gemm_vs_cublas_step"}, {"value", raw_total / ours_total}, {"unit", "ratio"},
        {"batch", batch}, {"distjax_ms_per_step", ours_total},
        {"cublaslt_ms_per_step", raw_total},
        {"note", "each product weighted as a step runs it (12 blocks' four layers, the head "
                 "once), forward, input and weight gradients; plain products, no epilogues"}});
#else
  (void)argc;
  (void)argv;
#endif
  return 0;
}
