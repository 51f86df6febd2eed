// The CUDA backend's GEMM family, through cuBLASLt: every product of the table is one
// cublasLtMatmul (a batched, strided one) on the calling thread's stream, with its plan
// (descriptors, layouts and the heuristic's algorithm) cached per problem.
//
// cuBLASLt is column-major and the table is row-major: a row-major X (r x c) is the
// column-major X^T (c x r) with the same leading dimension, so C = op(A) op(B) is computed
// as C^T = op(B)^T op(A)^T, with B's buffer first and A's second.
//
// Precision: f32 operands multiply in full f32 (CUBLAS_COMPUTE_32F) unless TF32 is allowed
// (allow_tf32, or DISTJAX_ALLOW_TF32=1); bf16 operands multiply on the tensor cores with f32
// accumulation. The bias is f32; C (and GELU's aux) are f32, bf16 or f16, rounded by
// cuBLASLt's epilogue (BIAS, GELU_AUX, GELU_AUX_BIAS). Where cuBLASLt takes no f32 bias
// beside a 16-bit D, the bias goes rounded to D's type; where it offers no algorithm for an
// epilogue at all, the product is summed in f32 and the copy and elementwise kernels round
// it and apply GELU, as the CPU does. Backward epilogues: GELU's derivative with the bias
// gradient (DGELU_BGRAD, DGELU) and a weight gradient's bias gradient (BGRADA), each with a
// kernel to fall back on.
#include <cublasLt.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda_runtime.hpp"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor {
namespace {

std::atomic<int>& tf32_flag() {
  // -1: not yet read from the environment.
  static std::atomic<int> flag{-1};
  return flag;
}

}  // namespace

void set_allow_tf32(bool allow) {
  tf32_flag().store(allow ? 1 : 0);
}

bool allow_tf32() {
  int f = tf32_flag().load();
  if (f < 0) {
    const char* env = std::getenv("DISTJAX_ALLOW_TF32");
    f = env && std::strcmp(env, "1") == 0 ? 1 : 0;
    int expected = -1;
    tf32_flag().compare_exchange_strong(expected, f);
  }
  return f == 1;
}

namespace cuda {
namespace {

using detail::GemmKey;
using detail::Stream;
using detail::UnaryOp;

#define DISTJAX_CUBLAS_CHECK(expr, op)                                                      \
  do {                                                                                      \
    const cublasStatus_t distjax_cublas_st_ = (expr);                                       \
    DISTJAX_CHECK(distjax_cublas_st_ == CUBLAS_STATUS_SUCCESS, Error, "[", op, "] ", #expr, \
                  " failed: ", cublasLtGetStatusName(distjax_cublas_st_), " (",             \
                  cublasLtGetStatusString(distjax_cublas_st_), ")");                        \
  } while (0)

// cuBLASLt's workspace per thread: what its heuristics ask of it for large products.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// The calling thread's cuBLASLt handle and workspace, made once (on the device current
// then: the one a thread's kernels run on).
struct ThreadContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  ThreadContext() {
    DISTJAX_CUBLAS_CHECK(cublasLtCreate(&handle), "gemm");
    DISTJAX_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes), "gemm", "cuBLASLt's workspace");
  }
  ~ThreadContext() {
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
};

ThreadContext& context() {
  thread_local ThreadContext ctx;
  return ctx;
}

// The largest power of two (at most 256) dividing every one of the values: the alignment
// in bytes cuBLASLt may assume of a matrix's pointer, leading dimension and batch stride.
std::int64_t alignment(std::initializer_list<std::uint64_t> values) {
  std::uint64_t bits = 256;
  for (std::uint64_t v : values)
    bits |= v;
  return std::int64_t{1} << std::countr_zero(bits);
}

// One matrix of a product in cuBLASLt's column-major terms.
// Every field is 64 bits wide, so that the structs have no padding and compare and hash
// as bytes.
struct Operand {
  std::int64_t type;  // cudaDataType_t
  std::int64_t trans;
  std::int64_t rows, cols, ld, batch_stride;  // of the stored matrix
};

// The GELU in a problem's epilogue: none, GELU with its input kept as aux (the forward),
// or GELU's derivative from that aux (the backward; the bias pointer then receives the
// bias gradient).
enum Gelu : std::int64_t { kNoGelu = 0, kGeluAux = 1, kDgelu = 2 };

// A bias pointer's role: a bias added to the product, or (BGRADA) the receiver of the
// column sums over K of cuBLASLt's A, one per row of D.
enum BiasRole : std::int64_t { kAddBias = 0, kBiasGradOfA = 1 };

// A problem: everything a plan depends on.
struct Problem {
  Operand a, b;          // cuBLASLt's A and B (the table's B and A)
  std::int64_t m, n, k;  // D is m x n (column-major), ld ldd; GELU's aux the same
  std::int64_t ldd, stride_d, batch;
  std::int64_t d_type;                       // cudaDataType_t of D and aux
  std::int64_t bias, bias_type, gelu, tf32;  // bias_type: cudaDataType_t; gelu: a Gelu
  std::int64_t bias_role;                    // a BiasRole (with bias)
  std::int64_t align_a, align_b, align_d;
  bool operator==(const Problem& o) const { return std::memcmp(this, &o, sizeof(Problem)) == 0; }
};

struct ProblemHash {
  std::size_t operator()(const Problem& p) const {
    const auto* w = reinterpret_cast<const unsigned char*>(&p);
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < sizeof(Problem); ++i)
      h = (h ^ w[i]) * 1099511628211ull;
    return h;
  }
};

// DISTJAX_CUDA_GEMM_TUNE=1: each problem times up to kTuneCandidates of the heuristic's
// algorithms on its first call and keeps the fastest (PyTorch's TunableOp, in-process). Off
// by default: each algorithm is deterministic, but the choice follows timings, so two runs
// may pick algorithms that round differently.
constexpr int kTuneCandidates = 8;
bool gemm_tuning() {
  static const bool on = [] {
    const char* env = std::getenv("DISTJAX_CUDA_GEMM_TUNE");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return on;
}

// What tuning found in this process (cuda_gemm_tuning()).
std::atomic<std::int64_t> tuned_problems{0}, tuned_changed{0};
std::atomic<std::int64_t> tuned_saved_ns{0};

// A problem's cuBLASLt objects and the algorithm the heuristic chose (with tuning: its
// candidates, best first, until the first call times them).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // emptied once timed
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                                   std::int64_t ld, std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  DISTJAX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                                  static_cast<std::uint64_t>(cols), ld),
                       "gemm");
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    DISTJAX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &count, sizeof(count)),
                         "gemm");
    DISTJAX_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                         sizeof(stride)),
        "gemm");
  }
  return l;
}

// Whether the problem's epilogue goes beyond an f32 D with a bias: then make_plan may find
// no algorithm, and the caller sums in f32 instead.
bool optional_epilogue(const Problem& p) {
  return p.gelu || p.bias_role != kAddBias || p.d_type != CUDA_R_32F;
}

void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                   const void* value, std::size_t size) {
  DISTJAX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, value, size), "gemm");
}

// The problem's cuBLASLt objects and algorithm; null when cuBLASLt has none for an
// optional epilogue (an error otherwise).
std::unique_ptr<Plan> make_plan(const Problem& p) {
  auto plan = std::make_unique<Plan>();
  const bool f32 = p.a.type == CUDA_R_32F;
  static_assert(std::has_unique_object_representations_v<Problem>, "Problem has padding");
  const cublasComputeType_t compute =
      f32 && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DISTJAX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F), "gemm");
  const cublasOperation_t ta = p.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  DISTJAX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
      "gemm");
  DISTJAX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
      "gemm");
  // The bias: one value per row of D, i.e. per column of the row-major C, the same for
  // every batch (bias batch stride 0, cuBLASLt's default). GELU's aux: the pre-activation,
  // laid out as D, in D's type (cuBLASLt's default).
  // DGELU_BGRAD: d = (A B) gelu'(aux), and the bias gradient (d summed per row of D) into
  // the bias pointer. BGRADA: A summed over K into the bias pointer.
  const cublasLtEpilogue_t epi =
      p.bias && p.bias_role == kBiasGradOfA ? CUBLASLT_EPILOGUE_BGRADA
      : p.gelu == kDgelu ? (p.bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU)
      : p.gelu           ? (p.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
      : p.bias           ? CUBLASLT_EPILOGUE_BIAS
                         : CUBLASLT_EPILOGUE_DEFAULT;
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  if (p.bias) {
    const auto bias_type = static_cast<std::int32_t>(p.bias_type);
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
  }
  if (p.gelu) {
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.ldd, sizeof(p.ldd));
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &p.stride_d,
                  sizeof(p.stride_d));
  }
  plan->la = make_layout(static_cast<cudaDataType_t>(p.a.type), p.a.rows, p.a.cols, p.a.ld, p.batch,
                         p.a.batch_stride);
  plan->lb = make_layout(static_cast<cudaDataType_t>(p.b.type), p.b.rows, p.b.cols, p.b.ld, p.batch,
                         p.b.batch_stride);
  plan->ld =
      make_layout(static_cast<cudaDataType_t>(p.d_type), p.m, p.n, p.ldd, p.batch, p.stride_d);

  cublasLtMatmulPreference_t pref = nullptr;
  DISTJAX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), "gemm");
  const std::uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  const auto align_a = static_cast<std::uint32_t>(p.align_a);
  const auto align_b = static_cast<std::uint32_t>(p.align_b);
  const auto align_d = static_cast<std::uint32_t>(p.align_d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      context().handle, plan->desc, plan->la, plan->lb, plan->ld, plan->ld, pref,
      gemm_tuning() ? kTuneCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  const cublasLtMatmulHeuristicResult_t& result = results[0];
  if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && optional_epilogue(p)) return nullptr;
  DISTJAX_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, Error,
                "[gemm] cuBLASLt has no algorithm for a ", p.batch, " x (", p.n, " x ", p.k,
                ") x (", p.k, " x ", p.m, ") product of ", f32 ? "f32" : "bf16",
                " operands (alignments ", p.align_a, "/", p.align_b, "/", p.align_d,
                " bytes): ", cublasLtGetStatusString(st));
  plan->algo = result.algo;
  if (found > 1)
    for (int i = 0; i < found; ++i)
      plan->candidates.push_back(results[i].algo);
  return plan;
}

// The calling thread's plans, made once per problem (null, also cached: none to run).
std::unordered_map<Problem, std::unique_ptr<Plan>, ProblemHash>& plans() {
  thread_local std::unordered_map<Problem, std::unique_ptr<Plan>, ProblemHash> cache;
  return cache;
}

Plan* plan_for(const Problem& p) {
  auto& cache = plans();
  auto it = cache.find(p);
  if (it == cache.end()) it = cache.emplace(p, make_plan(p)).first;
  return it->second.get();
}

// D's bytes: its columns' leading dimension times its columns, per batch.
std::size_t d_bytes(const Problem& p) {
  const std::size_t es = p.d_type == CUDA_R_32F ? 4 : 2;
  const std::int64_t per_batch = p.ldd * p.n;
  const std::int64_t total = p.batch > 1 ? p.stride_d * (p.batch - 1) + per_batch : per_batch;
  return static_cast<std::size_t>(total) * es;
}

// Times the plan's candidates on this call's operands (one warm-up and three timed runs
// each, D written to a scratch buffer, so that C, aux and the bias pointer's outputs are
// only rewritten by the call that follows) and keeps the fastest. The stream waits for the
// timings: once per problem and thread.
void tune(Plan& plan, const Problem& p, const void* a, const void* b, const void* c, float alpha,
          float beta, cudaStream_t stream) {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  candidates.swap(plan.candidates);
  ThreadContext& ctx = context();
  void* scratch = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, d_bytes(p), stream), "gemm", "a tuning scratch of ",
                     d_bytes(p), " bytes");
  cudaEvent_t start = nullptr, stop = nullptr;
  DISTJAX_CUDA_CHECK(cudaEventCreate(&start), "gemm");
  DISTJAX_CUDA_CHECK(cudaEventCreate(&stop), "gemm");
  float best_ms = -1, first_ms = -1;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    auto once = [&] {
      return cublasLtMatmul(ctx.handle, plan.desc, &alpha, a, plan.la, b, plan.lb, &beta, c,
                            plan.ld, scratch, plan.ld, &candidates[i], ctx.workspace,
                            kWorkspaceBytes, stream);
    };
    if (once() != CUBLAS_STATUS_SUCCESS) continue;  // refused: not a candidate
    DISTJAX_CUDA_CHECK(cudaEventRecord(start, stream), "gemm");
    for (int r = 0; r < 3; ++r)
      once();
    DISTJAX_CUDA_CHECK(cudaEventRecord(stop, stream), "gemm");
    DISTJAX_CUDA_CHECK(cudaEventSynchronize(stop), "gemm");
    float ms = 0;
    DISTJAX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "gemm");
    if (i == 0) first_ms = ms;
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      plan.algo = candidates[i];
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, stream), "gemm");
  ++tuned_problems;
  if (first_ms >= 0 && best_ms < first_ms) {
    ++tuned_changed;
    tuned_saved_ns += static_cast<std::int64_t>((first_ms - best_ms) / 3 * 1e6);
  }
}

// D = alpha * A B + beta * C for the problem (its pointers given; C is D unless c_in is
// given; aux with GELU), on the thread's stream. False, running nothing, where an optional
// epilogue has no algorithm or cuBLASLt refuses the call (the problem is then not tried
// again on this thread).
bool run(const Problem& p, const void* a, const void* b, const float* bias, void* d, void* aux,
         float alpha, float beta, const void* c_in = nullptr) {
  Plan* found = plan_for(p);
  if (!found) return false;
  Plan& plan = *found;
  if (p.bias) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  if (p.gelu)
    set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
  ThreadContext& ctx = context();
  const cudaStream_t stream = thread_stream();
  if (!plan.candidates.empty()) tune(plan, p, a, b, c_in ? c_in : d, alpha, beta, stream);
  const cublasStatus_t st =
      cublasLtMatmul(ctx.handle, plan.desc, &alpha, a, plan.la, b, plan.lb, &beta, c_in ? c_in : d,
                     plan.ld, d, plan.ld, &plan.algo, ctx.workspace, kWorkspaceBytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS && optional_epilogue(p)) {
    plans()[p].reset();
    return false;
  }
  DISTJAX_CUBLAS_CHECK(st, "gemm");
  return true;
}

std::uint64_t addr(const void* p) {
  return reinterpret_cast<std::uint64_t>(p);
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

std::atomic<std::int64_t> epilogues_fused{0}, epilogues_unfused{0};

// The cuBLASLt problem of `key` on these pointers (aux and residual may be null).
Problem problem_of(const GemmKey& key, const void* a, const void* b, const void* c, const void* aux,
                   const void* residual) {
  const auto [batch, m, n, k, ta, tb, b_shared, has_bias, src, dst, gelu] = key;
  // Halves on the tensor cores with f32 accumulation.
  const cudaDataType_t type = cuda_type(src);
  const std::uint64_t es = src == DType::F32 ? 4 : 2, ds = dst == DType::F32 ? 4 : 2;
  Problem p{};
  // cuBLASLt's A: the table's B, wanted as N x K (column-major).
  p.a = tb ? Operand{static_cast<std::int64_t>(type), true, k, n, k, b_shared ? 0 : n * k}
           : Operand{static_cast<std::int64_t>(type), false, n, k, n, b_shared ? 0 : k * n};
  // cuBLASLt's B: the table's A, wanted as K x M.
  p.b = ta ? Operand{static_cast<std::int64_t>(type), true, m, k, m, m * k}
           : Operand{static_cast<std::int64_t>(type), false, k, m, k, m * k};
  p.m = n;
  p.n = m;
  p.k = k;
  p.ldd = n;
  p.stride_d = m * n;
  p.batch = batch;
  p.d_type = cuda_type(dst);
  p.bias = has_bias;
  p.bias_type = CUDA_R_32F;
  p.gelu = gelu ? kGeluAux : kNoGelu;
  p.tf32 = src == DType::F32 && allow_tf32();
  p.align_a =
      alignment({addr(b), std::uint64_t(p.a.ld) * es, std::uint64_t(p.a.batch_stride) * es});
  p.align_b =
      alignment({addr(a), std::uint64_t(p.b.ld) * es, std::uint64_t(p.b.batch_stride) * es});
  // aux is laid out as D: its pointer bounds D's alignment too.
  p.align_d = alignment(
      {addr(c), addr(aux), addr(residual), std::uint64_t(n) * ds, std::uint64_t(m * n) * ds});
  return p;
}

// Runs `key` (k > 0) with its epilogue fused into cuBLASLt's; false where cuBLASLt has no
// algorithm for it. The bias goes in f32; for a 16-bit D where cuBLASLt takes no f32 bias,
// rounded to D's type (as PyTorch's bf16 linear holds it). A residual is cuBLASLt's C
// (beta = 1), its bias added after it.
bool gemm_fused(const GemmKey& key, const void* a, const void* b, const float* bias,
                const float* residual, void* c, void* aux) {
  const auto [batch, m, n, k, ta, tb, b_shared, has_bias, src, dst, gelu] = key;
  const std::uint64_t ds = dst == DType::F32 ? 4 : 2;
  Problem p = problem_of(key, a, b, c, gelu ? aux : nullptr, residual);
  // GELU's aux wants a leading dimension and batch stride divisible by 8 elements.
  const bool optional = optional_epilogue(p);
  if (gelu && (n % 8 != 0 || (batch > 1 && (m * n) % 8 != 0))) {
    ++epilogues_unfused;
    return false;
  }
  bool done = run(p, b, a, has_bias ? bias : nullptr, c, aux, 1.f, residual ? 1.f : 0.f, residual);
  if (!done && optional && has_bias && dst != DType::F32) {
    p.bias_type = p.d_type;
    const cudaStream_t stream = thread_stream();
    void* rounded = nullptr;
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&rounded, static_cast<std::size_t>(n) * ds, stream), "gemm",
                       "a bias of ", n, " elements");
    copy_kernels.convert(bias, DType::F32, rounded, dst, n, Stream{});
    done = run(p, b, a, static_cast<const float*>(rounded), c, aux, 1.f, 0.f);
    DISTJAX_CUDA_CHECK(cudaFreeAsync(rounded, stream), "gemm");
  }
  if (optional) ++(done ? epilogues_fused : epilogues_unfused);
  return done;
}

// rows x n of `sum` = the bias in every row (zeros without one), by doubling copies.
void fill_rows(float* sum, const float* bias, std::int64_t rows, std::int64_t n) {
  const cudaStream_t stream = thread_stream();
  const std::size_t row_bytes = static_cast<std::size_t>(n) * sizeof(float);
  if (!bias) {
    DISTJAX_CUDA_CHECK(cudaMemsetAsync(sum, 0, row_bytes * rows, stream), "gemm");
    return;
  }
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(sum, bias, row_bytes, cudaMemcpyDeviceToDevice, stream),
                     "gemm");
  for (std::int64_t done = 1; done < rows; done *= 2) {
    const std::int64_t count = std::min(done, rows - done);
    DISTJAX_CUDA_CHECK(
        cudaMemcpyAsync(sum + done * n, sum, row_bytes * count, cudaMemcpyDeviceToDevice, stream),
        "gemm");
  }
}

// Runs `key` as an f32 sum P (+ bias) and then the copy and elementwise kernels: aux = P
// and C = gelu(P), rounded as written (the CPU's order of work).
void gemm_unfused(const GemmKey& key, const void* a, const void* b, const float* bias, void* c,
                  void* aux) {
  const std::int64_t rows = key.batch * key.m, total = rows * key.n;
  const cudaStream_t stream = thread_stream();
  void* scratch = nullptr;
  float* sum = nullptr;
  if (key.dst == DType::F32) {
    sum = static_cast<float*>(key.gelu ? aux : c);
  } else {
    DISTJAX_CUDA_CHECK(
        cudaMallocAsync(&scratch, static_cast<std::size_t>(total) * sizeof(float), stream), "gemm",
        "an f32 sum of ", total, " elements");
    sum = static_cast<float*>(scratch);
  }
  if (key.k == 0) {
    fill_rows(sum, key.bias ? bias : nullptr, rows, key.n);
  } else {
    GemmKey f32_key = key;
    f32_key.dst = DType::F32;
    f32_key.gelu = false;
    DISTJAX_CHECK(gemm_fused(f32_key, a, b, bias, nullptr, sum, nullptr), Error,
                  "[gemm] cuBLASLt has no algorithm for an f32 product");
  }
  if (key.gelu && key.dst == DType::F32) {
    elementwise_kernels.unary(UnaryOp::GeluTanh, sum, static_cast<float*>(c), total, 0.f);
  } else {
    if (key.gelu) {
      copy_kernels.convert(sum, DType::F32, aux, key.dst, total, Stream{});
      elementwise_kernels.unary(UnaryOp::GeluTanh, sum, sum, total, 0.f);
    }
    if (key.dst != DType::F32) copy_kernels.convert(sum, DType::F32, c, key.dst, total, Stream{});
  }
  if (scratch) DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, stream), "gemm");
}

void gemm(const GemmKey& key, const void* a, const void* b, const float* bias,
          const float* residual, void* c, void* aux) {
  for (const DType t : {key.src, key.dst})
    DISTJAX_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16, NotImplemented,
                  "[gemm] CUDA multiplies and writes f32, bf16 or f16, not ", dtype_name(t));
  if (key.m == 0 || key.n == 0 || key.batch == 0) return;
  if (residual) {
    // An f32 C without GELU (the op checks): cuBLASLt's C, never an optional epilogue.
    DISTJAX_CHECK(key.k > 0, NotImplemented,
                  "[gemm] CUDA adds a residual to a product with k > 0 only");
    gemm_fused(key, a, b, bias, residual, c, aux);
    return;
  }
  if (key.k > 0 && gemm_fused(key, a, b, bias, nullptr, c, aux)) return;
  gemm_unfused(key, a, b, bias, c, aux);
}

// GELU's derivative from aux in cuBLASLt's epilogue for 16-bit operands: DGELU_BGRAD where
// cuBLASLt has it with an f32 bias gradient, else DGELU and the bias gradient summed from
// d (one read of it: H100, cuBLASLt 13.0, has no bf16 DGELU_BGRAD with an f32 bias).
// f32 operands, and what cuBLASLt refuses, take the f32 product and the epilogue_backward
// kernel: in f32 that is the two linears' arithmetic exactly (cuBLASLt's derivative and
// bias sum round differently, which the strategies' parity tests on a GPU see as noise
// above their f32 tolerance).
void gemm_dgelu(const GemmKey& key, const void* a, const void* b, const void* aux, void* c,
                float* bias_grad) {
  if (key.m == 0 || key.n == 0) return;
  // aux's leading dimension, as the forward's.
  if (key.k > 0 && key.n % 8 == 0 && key.dst != DType::F32) {
    Problem p = problem_of(key, a, b, c, aux, nullptr);
    p.gelu = kDgelu;
    p.bias = bias_grad != nullptr;
    if (run(p, b, a, bias_grad, c, const_cast<void*>(aux), 1.f, 0.f)) {
      ++epilogues_fused;
      return;
    }
    if (p.bias) {
      p.bias = false;
      if (run(p, b, a, nullptr, c, const_cast<void*>(aux), 1.f, 0.f)) {
        epilogue_backward(c, key.dst, nullptr, DType::F32, nullptr, key.dst, bias_grad, key.m,
                          key.n);
        ++epilogues_fused;
        return;
      }
    }
  }
  ++epilogues_unfused;
  const cudaStream_t stream = thread_stream();
  const std::int64_t total = key.m * key.n;
  void* sum = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocAsync(&sum, static_cast<std::size_t>(total) * sizeof(float), stream),
                     "gemm", "an f32 product of ", total, " elements");
  GemmKey f32_key = key;
  f32_key.dst = DType::F32;
  gemm(f32_key, a, b, nullptr, nullptr, sum, nullptr);
  epilogue_backward(sum, DType::F32, aux, key.dst, c, key.dst, bias_grad, key.m, key.n);
  DISTJAX_CUDA_CHECK(cudaFreeAsync(sum, stream), "gemm");
}

// The weight gradient A^T B with B's column sums from cuBLASLt's BGRADA epilogue (its A
// is the table's B), for 16-bit operands; f32 operands, and problems cuBLASLt has no such
// algorithm for, take the product and epilogue_backward's column sums (f32: the order that
// depends on the sizes only, which the strategies' parity tests compare at 1e-5).
void gemm_bias_grad(const GemmKey& key, const void* a, const void* b, void* c, float* bias_grad) {
  if (bias_grad && key.src != DType::F32 && key.m > 0 && key.n > 0 && key.k > 0) {
    Problem p = problem_of(key, a, b, c, nullptr, nullptr);
    p.bias = true;
    p.bias_role = kBiasGradOfA;
    if (run(p, b, a, bias_grad, c, nullptr, 1.f, 0.f)) {
      ++epilogues_fused;
      return;
    }
    ++epilogues_unfused;
  }
  gemm(key, a, b, nullptr, nullptr, c, nullptr);
  if (bias_grad)
    epilogue_backward(b, key.src, nullptr, DType::F32, nullptr, key.src, bias_grad, key.k, key.n);
}

void gemm_f32_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const float* a, std::int64_t lda, std::int64_t stride_a,
                      const float* b, std::int64_t ldb, std::int64_t stride_b, float beta, float* c,
                      std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  if (m == 0 || n == 0 || batch <= 0) return;
  Problem p{};
  p.a = trans_b ? Operand{std::int64_t{CUDA_R_32F}, true, k, n, ldb, stride_b}
                : Operand{std::int64_t{CUDA_R_32F}, false, n, k, ldb, stride_b};
  p.b = trans_a ? Operand{std::int64_t{CUDA_R_32F}, true, m, k, lda, stride_a}
                : Operand{std::int64_t{CUDA_R_32F}, false, k, m, lda, stride_a};
  p.m = n;
  p.n = m;
  p.k = k;
  p.ldd = ldc;
  p.d_type = CUDA_R_32F;
  p.tf32 = allow_tf32();
  // One C for every product: the products run one after another, each adding to the last.
  const bool accumulate = stride_c == 0 && batch > 1;
  p.batch = accumulate ? 1 : batch;
  p.stride_d = accumulate ? 0 : stride_c;
  if (!accumulate) {
    p.a.batch_stride = stride_b;
    p.b.batch_stride = stride_a;
  } else {
    p.a.batch_stride = p.b.batch_stride = 0;
  }
  p.align_a = alignment({addr(b), std::uint64_t(ldb) * 4, std::uint64_t(stride_b) * 4});
  p.align_b = alignment({addr(a), std::uint64_t(lda) * 4, std::uint64_t(stride_a) * 4});
  p.align_d = alignment({addr(c), std::uint64_t(ldc) * 4, std::uint64_t(stride_c) * 4});
  if (k == 0) {
    DISTJAX_CHECK(beta == 0.f || beta == 1.f, NotImplemented, "[gemm_f32_strided] k = 0 with beta ",
                  beta);
    if (beta == 1.f) return;
    for (std::int64_t i = 0; i < p.batch; ++i)
      DISTJAX_CUDA_CHECK(cudaMemset2DAsync(c + i * stride_c, static_cast<std::size_t>(ldc) * 4, 0,
                                           static_cast<std::size_t>(n) * 4,
                                           static_cast<std::size_t>(m), thread_stream()),
                         "gemm_f32_strided");
    return;
  }
  if (!accumulate) {
    run(p, b, a, nullptr, c, nullptr, alpha, beta);
    return;
  }
  for (std::int64_t i = 0; i < batch; ++i)
    run(p, b + i * stride_b, a + i * stride_a, nullptr, c, nullptr, alpha, beta);
}

}  // namespace

const detail::GemmKernels gemm_kernels{
    .gemm = gemm,
    .epilogue_backward = epilogue_backward,
    .gemm_dgelu = gemm_dgelu,
    .gemm_bias_grad = gemm_bias_grad,
    .gemm_f32_strided = gemm_f32_strided,
};

}  // namespace cuda

CudaGemmEpilogueCalls cuda_gemm_epilogue_calls() {
  return {cuda::epilogues_fused.load(), cuda::epilogues_unfused.load()};
}

CudaGemmTuning cuda_gemm_tuning() {
  return {cuda::tuned_problems.load(), cuda::tuned_changed.load(),
          static_cast<double>(cuda::tuned_saved_ns.load()) * 1e-6};
}
}  // namespace distjax::tensor
