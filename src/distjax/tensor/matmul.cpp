#include "distjax/tensor/matmul.hpp"

#include <cassert>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>
#include <unordered_map>

#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/gemm.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::tensor {
namespace detail {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& g) const {
    std::size_t h = 1469598103934665603ull;
    for (std::int64_t v :
         {g.batch, g.m, g.n, g.k,
          std::int64_t(g.ta) | std::int64_t(g.tb) << 1 | std::int64_t(g.b_shared) << 2 |
              std::int64_t(g.bias) << 3 | std::int64_t(g.src) << 4})
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
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Primitives are cached per thread: simulated devices never contend on the cache,
// and a primitive is only ever executed by the thread that made it.
GemmPlan& plan_for(const GemmKey& key) {
  thread_local std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [batch, m, n, k, ta, tb, b_shared, bias, src] = key;
  const std::int64_t bb = b_shared ? 1 : batch;
  const dt s = src == DType::BF16 ? dt::bf16 : dt::f32;
  GemmPlan p;
  p.a = dnnl::memory::desc(dims{batch, m, k}, s, ta ? dims{m * k, 1, m} : dims{m * k, k, 1});
  p.b = dnnl::memory::desc(dims{bb, k, n}, s, tb ? dims{k * n, 1, k} : dims{k * n, n, 1});
  p.c = dnnl::memory::desc(dims{batch, m, n}, dt::f32, dims{m * n, n, 1});
  if (bias) p.bias = dnnl::memory::desc(dims{1, 1, n}, dt::f32, dims{n, n, 1});
  dnnl::engine& e = cpu_engine();
#if DNNL_VERSION_MAJOR >= 3
  // oneDNN 3 (Debian 13) dropped the operation descriptors: the primitive descriptor takes
  // the engine and the memory descriptors directly.
  p.prim = dnnl::matmul(bias ? dnnl::matmul::primitive_desc(e, p.a, p.b, p.bias, p.c)
                             : dnnl::matmul::primitive_desc(e, p.a, p.b, p.c));
#else
  dnnl::matmul::desc d =
      bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
  p.prim = dnnl::matmul(dnnl::matmul::primitive_desc(d, e));
#endif
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

}  // namespace

void run_gemm(const GemmKey& key, const void* a, const void* b, const float* bias, float* c) {
  assert(key.src == DType::F32 || key.src == DType::BF16);
  if (key.m == 0 || key.n == 0 || key.batch == 0) return;
  if (key.k == 0) {
    std::fill(c, c + key.batch * key.m * key.n, 0.f);
    return;
  }
  GemmPlan& p = plan_for(key);
  thread_local dnnl::stream stream(cpu_engine());
  p.ma.set_data_handle(const_cast<void*>(a));
  p.mb.set_data_handle(const_cast<void*>(b));
  p.mc.set_data_handle(c);
  if (key.bias) p.mbias.set_data_handle(const_cast<float*>(bias));
  p.prim.execute(stream, p.args);
  stream.wait();
}

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

}  // namespace detail

namespace {

// Operands are both f32, both bf16 or both f16 (the compute dtype of a mixed-precision
// policy, nn/precision.hpp); f32 operands take exactly the f32 path.
void check_operand_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  detail::require_cpu(op, {&a, &b});
  DISTJAX_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()), InvalidArgument, "[", op,
                "] operands must both be f32, both bf16 or both f16, got ", dtype_name(a.dtype()),
                " and ", dtype_name(b.dtype()), " (use astype)");
}

// What the GEMM reads: bf16 and f32 as they are; f16 widened to f32 (exact), since
// oneDNN 2.6 has no f16 matmul on this CPU: f16 operands have f16's range and precision,
// the products and sums are f32.
Tensor gemm_operand(const Tensor& t) {
  if (t.dtype() != DType::F16) return t;
  Tensor w = Tensor::empty(t.shape());
  detail::convert(t, w);
  return w;
}
DType gemm_dtype(const Tensor& t) {
  return t.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
}

// The cotangent dC rounded to the operands' dtype for the backward GEMMs (a bf16 or f16
// matmul runs its backward products in that dtype too); f32 returns it unchanged.
Tensor cotangent_in(const Tensor& g, DType dtype) {
  if (dtype == DType::F32) return g;
  Tensor out = Tensor::empty(g.shape(), dtype);
  detail::convert(g, out);
  return out;
}

// Shapes of op(A) (.., M, K) and op(B) (.., K, N) after checking them.
struct MatmulDims {
  Shape batch_shape;
  std::int64_t batch, m, n, k;
  bool b_shared;
};

MatmulDims check_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_operand_dtypes("matmul", a, b);
  DISTJAX_CHECK(a.rank() >= 2 && b.rank() >= 2, InvalidArgument,
                "[matmul] operands need rank >= 2, got ", to_string(a.shape()), " and ",
                to_string(b.shape()));
  MatmulDims d;
  d.m = ta ? a.size(-1) : a.size(-2);
  std::int64_t ka = ta ? a.size(-2) : a.size(-1);
  std::int64_t kb = tb ? b.size(-1) : b.size(-2);
  d.n = tb ? b.size(-2) : b.size(-1);
  DISTJAX_CHECK(ka == kb, InvalidArgument,
                "[matmul] inner dimensions differ: ", to_string(a.shape()), (ta ? "^T" : ""), " @ ",
                to_string(b.shape()), (tb ? "^T" : ""));
  d.k = ka;
  d.batch_shape = Shape(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  d.b_shared = b.rank() == 2;
  DISTJAX_CHECK(d.b_shared || b_batch == d.batch_shape, InvalidArgument,
                "[matmul] batch dimensions differ: ", to_string(a.shape()), " @ ",
                to_string(b.shape()), " (b may also be 2-D)");
  d.batch = numel(d.batch_shape);
  return d;
}

Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  MatmulDims d = check_matmul(a, b, ta, tb);
  Shape out_shape = d.batch_shape;
  out_shape.push_back(d.m);
  out_shape.push_back(d.n);
  Tensor out = Tensor::empty(out_shape);
  const Tensor ag = gemm_operand(a), bg = gemm_operand(b);
  const DType src = gemm_dtype(a);
  // With a shared B and no transpose of A, the batch folds into M: one larger GEMM.
  if (d.b_shared && !ta && d.batch > 1) {
    detail::run_gemm({1, d.batch * d.m, d.n, d.k, false, tb, true, false, src}, ag.raw_data(),
                     bg.raw_data(), nullptr, out.data<float>());
  } else {
    detail::run_gemm({d.batch, d.m, d.n, d.k, ta, tb, d.b_shared, false, src}, ag.raw_data(),
                     bg.raw_data(), nullptr, out.data<float>());
  }
  return out;
}

}  // namespace

// The cotangent of matmul's right operand B given A, B, dC (shared: a 2-D B used by every
// batch of a batched A, whose cotangent sums over the batch). dC is in A's and B's dtype
// (cotangent_in); the result is f32.
static Tensor matmul_grad_b(const Tensor& ad, const Tensor& bd, const Tensor& gc, bool ta, bool tb) {
  const bool shared = bd.rank() == 2 && ad.rank() > 2;
  Tensor gb;
  if (shared) {
    // B was shared by every batch: its cotangent sums over the batch.
    if (!ta) {
      Tensor a2 = ad.view({ad.numel() / ad.size(-1), ad.size(-1)});
      Tensor g2 = gc.view({gc.numel() / gc.size(-1), gc.size(-1)});
      gb = tb ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
    } else if (ad.dtype() != DType::F32) {
      // Reduced-precision operands: this rare layout runs in f32 on the widened values.
      return matmul_grad_b(astype(ad, DType::F32), astype(bd, DType::F32), astype(gc, DType::F32),
                           ta, tb);
    } else {
      // Accumulate per-batch products into one (K, N) or (N, K) buffer.
      gb = Tensor::zeros(bd.shape());
      const std::int64_t m = gc.size(-2), n = gc.size(-1), k = ad.size(-2);
      const std::int64_t batch = gc.numel() / (m * n);
      const float* pa = ad.data<float>();
      const float* pg = gc.data<float>();
      float* po = gb.data<float>();
      for (std::int64_t i = 0; i < batch; ++i) {
        const float beta = 1.f;
        if (tb)  // dB (N, K) += dC[i]^T A[i]^T
          detail::gemm_f32(true, true, n, k, m, 1.f, pg + i * m * n,
                           pa + i * k * m, beta, po);
        else  // dB (K, N) += A[i] dC[i]
          detail::gemm_f32(false, false, k, n, m, 1.f, pa + i * k * m,
                           pg + i * m * n, beta, po);
      }
    }
  } else {
    gb = tb ? matmul(gc, ad, true, ta) : matmul(ad, gc, !ta, false);
  }
  return gb;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tensor out = matmul_forward(a, b, ta, tb);
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record(
      "matmul", {a, b}, out,
      [ad = a.detach(), bd = b.detach(), ta, tb, ra = a.requires_grad(), rb = b.requires_grad(),
       bleaf = deferrable_weight(b, {a, b})](const std::vector<Tensor>& g) {
        // Cotangents of bf16/f16 operands come back f32 (their astype's backward
        // keeps them f32 for the master weights).
        const Tensor gc = cotangent_in(g[0], ad.dtype());
        Tensor ga, gb;
        const bool shared = bd.rank() == 2 && ad.rank() > 2;
        if (ra) {
          if (!ta) {
            ga = matmul(gc, bd, false, !tb);
          } else if (!shared) {
            ga = matmul(bd, gc, tb, true);
          } else {
            // dA[i] = op(B) dC[i]^T for a shared B: per batch, no batched operand on the
            // left (in f32, widening reduced-precision operands: a rare layout).
            ga = Tensor::empty(ad.shape());
            const std::int64_t m = gc.size(-2), n = gc.size(-1), k = ad.size(-2);
            const std::int64_t batch = gc.numel() / (m * n);
            const Tensor b32 = astype(bd, DType::F32), g32 = astype(gc, DType::F32);
            const float* pb = b32.data<float>();
            const float* pg = g32.data<float>();
            float* po = ga.data<float>();
            for (std::int64_t i = 0; i < batch; ++i)
              detail::gemm_f32(tb, true, k, m, n, 1.f, pb, pg + i * m * n, 0.f, po + i * k * m);
          }
        }
        if (rb) {
          WeightGradStore* store = weight_grad_store();
          if (bleaf && store)  // zero-bubble: dB later (W pass)
            store->defer(bleaf, [ad, bd, gc, ta, tb] { return matmul_grad_b(ad, bd, gc, ta, tb); });
          else
            gb = matmul_grad_b(ad, bd, gc, ta, tb);
        }
        return std::vector<Tensor>{ga, gb};
      });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_operand_dtypes("linear", x, w);
  DISTJAX_CHECK(w.rank() == 2 && x.rank() >= 1 && x.size(-1) == w.size(0), InvalidArgument,
                "[linear] x ", to_string(x.shape()), " does not match kernel ",
                to_string(w.shape()), " (expected x (..., K), kernel (K, N))");
  const std::int64_t k = w.size(0), n = w.size(1), m = x.numel() / std::max<std::int64_t>(k, 1);
  if (bias.defined()) {
    detail::require_f32("linear", {&bias});
    DISTJAX_CHECK(bias.rank() == 1 && bias.size(0) == n, InvalidArgument, "[linear] bias ",
                  to_string(bias.shape()), " does not match kernel ", to_string(w.shape()));
  }
  Shape out_shape = x.shape();
  out_shape.back() = n;
  Tensor out = Tensor::empty(out_shape);
  const Tensor xg = gemm_operand(x), wg = gemm_operand(w);
  detail::run_gemm({1, m, n, k, false, false, true, bias.defined(), gemm_dtype(x)}, xg.raw_data(),
                   wg.raw_data(), bias.defined() ? bias.data<float>() : nullptr, out.data<float>());
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  if (!needs_grad(inputs)) return joined(out, inputs);
  return record("linear", inputs, out,
                [xd = x.detach(), wd = w.detach(), has_bias = bias.defined(),
                 rx = x.requires_grad(), rw = w.requires_grad(),
                 wleaf = deferrable_weight(w, inputs),
                 bleaf = bias.defined() ? deferrable_weight(bias, inputs)
                                        : std::shared_ptr<Node>()](const std::vector<Tensor>& g) {
                  const std::int64_t k = wd.size(0), n = wd.size(1);
                  // dx and dW from dC in the operands' dtype (f32 results); the bias
                  // gradient from the f32 cotangent.
                  Tensor g2 = cotangent_in(g[0], xd.dtype()).view({g[0].numel() / n, n});
                  Tensor x2 = xd.view({xd.numel() / k, k});
                  std::vector<Tensor> out;
                  out.push_back(rx ? matmul(g2, wd, false, true).view(xd.shape()) : Tensor());
                  WeightGradStore* store = weight_grad_store();
                  if (rw && wleaf && store) {  // zero-bubble: dW later (W pass)
                    store->defer(wleaf, [x2, g2] { return matmul(x2, g2, true, false); });
                    out.emplace_back();
                  } else {
                    out.push_back(rw ? matmul(x2, g2, true, false) : Tensor());
                  }
                  if (has_bias) {
                    Tensor g_rows = g[0].view({g[0].numel() / n, n});
                    if (bleaf && store) {  // zero-bubble: the bias's row sum in W too
                      store->defer(bleaf, [g_rows] { return sum(g_rows, {0}); });
                      out.emplace_back();
                    } else {
                      out.push_back(sum(g_rows, {0}));
                    }
                  }
                  return out;
                });
}

}  // namespace distjax::tensor
