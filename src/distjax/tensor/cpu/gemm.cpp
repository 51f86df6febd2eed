// CPU kernels: matrix products through oneDNN, its matmul primitives cached per GemmKey
// and thread, and its sgemm for strided products. The epilogues other than a bias (a
// rounded C beside bf16, GELU) and their backward run the family's other kernels over an
// f32 sum: the reference the CUDA backend's fused cuBLASLt epilogues are tested against.
// bf16 operands go to oneDNN's bf16 matmul (f32 accumulation) where this CPU has one
// (oneDNN 2.6: AVX-512); elsewhere (an AVX2 CPU) they are widened to f32, exactly, for its
// f32 matmul, and a bf16 C rounded from its f32 sum: the same products and f32 sums.
#include <omp.h>
#include <oneapi/dnnl/dnnl_version.h>

#include <algorithm>
#include <cassert>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::tensor::detail {

// The raw sgemm entry points tensor/matmul.hpp declares (for kernels of other families).

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* a, const float* b, float beta, float* c) {
  gemm_f32_ld(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void gemm_f32_ld(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                ldb, beta, c, ldc);
  DISTJAX_CHECK(st == dnnl_success, Error, "[gemm_f32] dnnl_sgemm failed with status ", int(st));
}

namespace cpu {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& g) const {
    std::size_t h = 1469598103934665603ull;
    for (std::int64_t v :
         {g.batch, g.m, g.n, g.k,
          std::int64_t(g.ta) | std::int64_t(g.tb) << 1 | std::int64_t(g.b_shared) << 2 |
              std::int64_t(g.bias) << 3 | std::int64_t(g.gelu) << 4 | std::int64_t(g.src) << 8 |
              std::int64_t(g.dst) << 16})
      h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct GemmPlan {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
  // Memory objects and the argument map, made once; each call only swaps the data
  // handles (creating them per call cost a few microseconds, noticeable on small GEMMs).
  dnnl::memory ma, mb, mc, mbias;
  std::unordered_map<int, dnnl::memory> args;
  // bf16 operands this CPU's oneDNN has no matmul for: the primitive is the f32 one, the
  // operands are widened first and a bf16 C is rounded from an f32 one.
  bool widened = false;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The matmul primitive of these descriptors; with `may_refuse`, an empty one where oneDNN
// has no implementation for them on this CPU.
dnnl::matmul make_matmul(const GemmPlan& p, bool bias, bool may_refuse) {
  dnnl::engine& e = cpu_engine();
  try {
#if DNNL_VERSION_MAJOR >= 3
    // oneDNN 3 (Debian 13) dropped the operation descriptors: the primitive descriptor
    // takes the engine and the memory descriptors directly.
    return dnnl::matmul(bias ? dnnl::matmul::primitive_desc(e, p.a, p.b, p.bias, p.c)
                             : dnnl::matmul::primitive_desc(e, p.a, p.b, p.c));
#else
    dnnl::matmul::desc d =
        bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
    return dnnl::matmul(dnnl::matmul::primitive_desc(d, e));
#endif
  } catch (const dnnl::error& err) {
    if (!may_refuse || err.status != dnnl_unimplemented) throw;
    return dnnl::matmul();
  }
}

// Primitives are cached per thread: simulated devices never contend on the cache,
// and a primitive is only ever executed by the thread that made it.
GemmPlan& plan_for(const GemmKey& key) {
  thread_local std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [batch, m, n, k, ta, tb, b_shared, bias, src, dst, gelu] = key;
  const std::int64_t bb = b_shared ? 1 : batch;
  GemmPlan p;
  // The bindings captured as copies: clang before 16 refuses a structured binding in a lambda.
  auto describe = [&p, bb, batch = batch, m = m, n = n, k = k, ta = ta, tb = tb](dt s, dt c_type) {
    p.a = dnnl::memory::desc(dims{batch, m, k}, s, ta ? dims{m * k, 1, m} : dims{m * k, k, 1});
    p.b = dnnl::memory::desc(dims{bb, k, n}, s, tb ? dims{k * n, 1, k} : dims{k * n, n, 1});
    p.c = dnnl::memory::desc(dims{batch, m, n}, c_type, dims{m * n, n, 1});
  };
  if (bias) p.bias = dnnl::memory::desc(dims{1, 1, n}, dt::f32, dims{n, n, 1});
  const bool bf16 = src == DType::BF16;
  // A bf16 C straight from the primitive (rounded to nearest even, as bf16(float)).
  describe(bf16 ? dt::bf16 : dt::f32, dst == DType::BF16 && !gelu ? dt::bf16 : dt::f32);
  p.prim = make_matmul(p, bias, /*may_refuse=*/bf16);
  if (!p.prim) {
    p.widened = true;
    describe(dt::f32, dt::f32);
    p.prim = make_matmul(p, bias, false);
  }
  dnnl::engine& e = cpu_engine();
  p.ma = dnnl::memory(p.a, e, DNNL_MEMORY_NONE);
  p.mb = dnnl::memory(p.b, e, DNNL_MEMORY_NONE);
  p.mc = dnnl::memory(p.c, e, DNNL_MEMORY_NONE);
  p.args = {{DNNL_ARG_SRC, p.ma}, {DNNL_ARG_WEIGHTS, p.mb}, {DNNL_ARG_DST, p.mc}};
  if (bias) {
    p.mbias = dnnl::memory(p.bias, e, DNNL_MEMORY_NONE);
    p.args.emplace(DNNL_ARG_BIAS, p.mbias);
  }
  return cache.emplace(key, std::move(p)).first->second;
}

// n elements of bf16 `from` widened into the calling thread's buffer `slot` (kept for its
// next call).
const float* widened(const void* from, std::int64_t n, int slot) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& w = buffers[slot];
  if (w.size() < static_cast<std::size_t>(n)) w.resize(static_cast<std::size_t>(n));
  copy_kernels.convert(from, DType::BF16, w.data(), DType::F32, n, Stream{});
  return w.data();
}

// C = A B + bias by the cached primitive, in its dtype (f32, or bf16 without GELU); k > 0.
void run_primitive(const GemmKey& key, const void* a, const void* b, const float* bias, void* c) {
  // oneDNN 2.6's bf16 matmul with a transposed B (strides {k n, 1, k}) whose N is not a
  // multiple of 16 gives wrong products with more than one OpenMP thread (x (21, 16) times
  // w (50, 16)^T summed to -103.1 instead of -24.07 on an AVX-512 BF16 CPU; right with one
  // thread, with N = 64, or with B laid out (K, N)). Such a B is laid out (K, N) here first.
  if (key.src == DType::BF16 && key.tb && key.n % 16 != 0) {
    const std::int64_t nb = key.b_shared ? 1 : key.batch, kn = key.k * key.n;
    thread_local std::vector<std::uint16_t> laid_out;
    if (laid_out.size() < static_cast<std::size_t>(nb * kn))
      laid_out.resize(static_cast<std::size_t>(nb * kn));
    const auto* from = static_cast<const std::uint16_t*>(b);  // (nb, n, k) row-major
    for (std::int64_t ib = 0; ib < nb; ++ib)
      for (std::int64_t j = 0; j < key.n; ++j)
        for (std::int64_t q = 0; q < key.k; ++q)
          laid_out[static_cast<std::size_t>(ib * kn + q * key.n + j)] = from[ib * kn + j * key.k + q];
    GemmKey untransposed = key;
    untransposed.tb = false;
    run_primitive(untransposed, a, laid_out.data(), bias, c);
    return;
  }
  GemmPlan& p = plan_for(key);
  thread_local dnnl::stream stream(cpu_engine());
  const bool round_c = p.widened && key.dst == DType::BF16 && !key.gelu;
  const std::int64_t c_size = key.batch * key.m * key.n;
  if (p.widened) {
    a = widened(a, key.batch * key.m * key.k, 0);
    b = widened(b, (key.b_shared ? 1 : key.batch) * key.k * key.n, 1);
  }
  float* c32 = nullptr;
  if (round_c) {
    thread_local std::vector<float> sum;
    if (sum.size() < static_cast<std::size_t>(c_size)) sum.resize(static_cast<std::size_t>(c_size));
    c32 = sum.data();
  }
  p.ma.set_data_handle(const_cast<void*>(a));
  p.mb.set_data_handle(const_cast<void*>(b));
  p.mc.set_data_handle(c32 ? c32 : c);
  if (key.bias) p.mbias.set_data_handle(const_cast<float*>(bias));
  p.prim.execute(stream, p.args);
  stream.wait();
  if (c32) copy_kernels.convert(c32, DType::F32, c, DType::BF16, c_size, Stream{});
}

// sum = P = A B + bias in f32 (the bias alone, or zeros, when k == 0).
void gemm_f32_sum(const GemmKey& key, const void* a, const void* b, const float* bias, float* sum) {
  const std::int64_t rows = key.batch * key.m;
  if (key.k == 0) {
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = sum + r * key.n;
      if (key.bias)
        std::copy(bias, bias + key.n, row);
      else
        std::fill(row, row + key.n, 0.f);
    }
    return;
  }
  GemmKey f32_key = key;
  f32_key.dst = DType::F32;
  f32_key.gelu = false;
  run_primitive(f32_key, a, b, bias, sum);
}

// n floats of the calling thread's, kept for its next call (no allocation per step).
float* f32_scratch(std::int64_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<std::size_t>(n)) scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

// c[i] += residual[i] (the residual connection's add, after the product: the bits of
// add(residual, linear(...))).
void add_residual(float* c, const float* residual, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrainMemory)
  for (std::int64_t i = 0; i < n; ++i)
    c[i] = residual[i] + c[i];
}

void gemm(const GemmKey& key, const void* a, const void* b, const float* bias,
          const float* residual, void* c, void* aux) {
  assert(key.src == DType::F32 || key.src == DType::BF16);
  assert(!residual || (key.dst == DType::F32 && !key.gelu));
  const std::int64_t n = key.batch * key.m * key.n;
  if (n == 0) return;
  if (residual) {
    float* out = static_cast<float*>(c);
    if (residual != out) {
      gemm_f32_sum(key, a, b, bias, out);
      return add_residual(out, residual, n);
    }
    // Accumulating into C itself: the product in a buffer of its own first.
    const std::unique_ptr<float[]> product(new float[static_cast<std::size_t>(n)]);
    gemm_f32_sum(key, a, b, bias, product.get());
    return add_residual(out, product.get(), n);
  }
  if (!key.gelu && key.k > 0 && (key.dst == DType::F32 || key.dst == DType::BF16))
    return run_primitive(key, a, b, bias, c);
  // P in f32 (in aux or C itself where that is f32, else in the thread's scratch), then aux
  // = P and C = gelu(P), rounded.
  float* sum = key.dst == DType::F32 ? static_cast<float*>(key.gelu ? aux : c) : f32_scratch(n);
  gemm_f32_sum(key, a, b, bias, sum);
  if (key.gelu) {
    if (key.dst == DType::F32)
      return elementwise_kernels.unary(UnaryOp::GeluTanh, sum, static_cast<float*>(c), n, 0.f);
    copy_kernels.convert(sum, DType::F32, aux, key.dst, n, Stream{});
    if (key.dst == DType::BF16)
      return elementwise_kernels.unary_bf16(UnaryOp::GeluTanh, sum, static_cast<bf16*>(c), n, 0.f);
    elementwise_kernels.unary(UnaryOp::GeluTanh, sum, sum, n, 0.f);
  }
  copy_kernels.convert(sum, DType::F32, c, key.dst, n, Stream{});
}

// d = g (* gelu'(aux)) in f32, its rounding and its column sums. An f32 g without GELU is
// summed by the reduce kernel and rounded by the copy kernel. Otherwise each thread takes a
// run of rows in blocks that stay in its cache: it widens g and aux there, applies GELU's
// derivative (the elementwise kernel's, its parallel loop run by this thread alone), writes
// the block's rounding and adds the block's rows to its column sums; the threads' sums are
// added in thread order (deterministic for a given thread count, as the reduce kernel).
void epilogue_backward(const void* g, DType g_dtype, const void* aux, DType aux_dtype, void* out,
                       DType out_dtype, float* bias_grad, std::int64_t rows, std::int64_t n) {
  const std::int64_t total = rows * n;
  if (n == 0) return;
  if (g_dtype == DType::F32 && !aux) {
    const auto* g32 = static_cast<const float*>(g);
    if (bias_grad) reduce_kernels.reduce(ReduceOp::Sum, g32, bias_grad, 1, rows, n);
    if (out) copy_kernels.convert(g32, DType::F32, out, out_dtype, total, Stream{});
    return;
  }
  const std::int64_t block_rows = std::max<std::int64_t>(1, 16384 / n);
  const int nt = total > kParallelGrainMemory ? omp_get_max_threads() : 1;
  std::vector<float> part(bias_grad ? static_cast<std::size_t>(nt * n) : 0, 0.f);
  const std::size_t g_size = static_cast<std::size_t>(dtype_size(g_dtype));
  const std::size_t aux_size = aux ? static_cast<std::size_t>(dtype_size(aux_dtype)) : 0;
  const std::size_t out_size = out ? static_cast<std::size_t>(dtype_size(out_dtype)) : 0;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    const std::int64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
    std::vector<float> gb(static_cast<std::size_t>(block_rows * n)), ab(aux ? gb.size() : 0);
    float* sums = bias_grad ? part.data() + t * n : nullptr;
    for (std::int64_t r = r0; r < r1; r += block_rows) {
      const std::int64_t len = std::min(block_rows, r1 - r) * n, at = r * n;
      copy_kernels.convert(static_cast<const char*>(g) + at * g_size, g_dtype, gb.data(),
                           DType::F32, len, Stream{});
      if (aux) {
        copy_kernels.convert(static_cast<const char*>(aux) + at * aux_size, aux_dtype, ab.data(),
                             DType::F32, len, Stream{});
        elementwise_kernels.unary_grad(UnaryOp::GeluTanh, gb.data(), ab.data(), nullptr, gb.data(),
                                       len, 0.f);
      }
      if (out)
        copy_kernels.convert(gb.data(), DType::F32, static_cast<char*>(out) + at * out_size,
                             out_dtype, len, Stream{});
      if (sums)
        for (std::int64_t i = 0; i < len; i += n) {
#pragma omp simd
          for (std::int64_t j = 0; j < n; ++j)
            sums[j] += gb[static_cast<std::size_t>(i + j)];
        }
    }
  }
  if (!bias_grad) return;
  std::copy(part.begin(), part.begin() + n, bias_grad);
  for (int t = 1; t < nt; ++t)
    for (std::int64_t j = 0; j < n; ++j)
      bias_grad[j] += part[static_cast<std::size_t>(t * n + j)];
}

void gemm_f32_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const float* a, std::int64_t lda, std::int64_t stride_a,
                      const float* b, std::int64_t ldb, std::int64_t stride_b, float beta, float* c,
                      std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  for (std::int64_t i = 0; i < batch; ++i)
    gemm_f32_ld(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
                beta, c + i * stride_c, ldc);
}

}  // namespace

// The product in f32 (the thread's scratch), then the epilogue's backward pass over it.
void gemm_dgelu(const GemmKey& key, const void* a, const void* b, const void* aux, void* c,
                float* bias_grad) {
  assert(key.batch == 1 && !key.bias && !key.gelu);
  const std::int64_t n = key.m * key.n;
  if (n == 0) return;
  float* sum = f32_scratch(n);
  gemm_f32_sum(key, a, b, nullptr, sum);
  epilogue_backward(sum, DType::F32, aux, key.dst, c, key.dst, bias_grad, key.m, key.n);
}

// The product, then the column sums of B by the epilogue's backward pass (no GELU, no
// rounding): what linear's backward does without this entry, to the bit.
void gemm_bias_grad(const GemmKey& key, const void* a, const void* b, void* c, float* bias_grad) {
  assert(key.batch == 1 && key.ta && !key.tb && !key.bias && !key.gelu);
  gemm(key, a, b, nullptr, nullptr, c, nullptr);
  if (bias_grad)
    epilogue_backward(b, key.src, nullptr, DType::F32, nullptr, key.src, bias_grad, key.k, key.n);
}

const GemmKernels gemm_kernels{
    .gemm = gemm,
    .epilogue_backward = epilogue_backward,
    .gemm_dgelu = gemm_dgelu,
    .gemm_bias_grad = gemm_bias_grad,
    .gemm_f32_strided = gemm_f32_strided,
};

}  // namespace cpu
}  // namespace distjax::tensor::detail
