#include "distjax/tensor/matmul.hpp"

#include <cstdlib>
#include <cstring>

#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {

namespace {

// Operands are both f32, both bf16 or both f16 (the compute dtype of a mixed-precision
// policy, nn/precision.hpp); f32 operands take exactly the f32 path.
void check_operand_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  DISTJAX_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()), InvalidArgument, "[", op,
                "] operands must both be f32, both bf16 or both f16, got ", dtype_name(a.dtype()),
                " and ", dtype_name(b.dtype()), " (use astype)");
}

// What the GEMM reads: bf16 and f32 as they are; f16 as it is on a GPU (cuBLASLt's tensor
// cores, f32 accumulation) and widened to f32 (exact) elsewhere, since oneDNN 2.6 has no
// f16 matmul on this CPU. Either way the operands have f16's range and precision, each
// product is exact in f32 and the sums are f32: the devices differ in summation order only.
bool f16_on_gpu(const Tensor& t) {
  return t.dtype() == DType::F16 && t.device().kind == DeviceKind::CUDA;
}
Tensor gemm_operand(const Tensor& t) {
  if (t.dtype() != DType::F16 || f16_on_gpu(t)) return t;
  Tensor w = Tensor::empty(t.shape(), DType::F32, t.device());
  detail::convert(t, w);
  return w;
}
DType gemm_dtype(const Tensor& t) {
  if (f16_on_gpu(t)) return DType::F16;
  return t.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
}

// The cotangent dC rounded to the operands' dtype for the backward GEMMs (a bf16 or f16
// matmul runs its backward products in that dtype too); f32, or a cotangent already in
// that dtype, returns it unchanged.
Tensor cotangent_in(const Tensor& g, DType dtype) {
  if (dtype == DType::F32 || g.dtype() == dtype) return g;
  Tensor out = Tensor::empty(g.shape(), dtype, g.device());
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

// out = the product `key` describes of a and b (converted by gemm_operand) plus bias, its
// epilogue applied (aux: GELU's pre-activation).
void run_gemm(const char* op, const detail::GemmKey& key, const Tensor& a, const Tensor& b,
              const Tensor& bias, Tensor& out, Tensor* aux = nullptr,
              const Tensor& residual = Tensor()) {
  const Tensor no_aux;
  detail::Dispatch k(op, &detail::KernelTable::gemm,
                     {&a, &b, &bias, &out, aux ? aux : &no_aux, &residual});
  k->gemm(key, a.raw_data(), b.raw_data(), bias.defined() ? bias.data<float>() : nullptr,
          residual.defined() ? residual.data<float>() : nullptr, out.raw_data(),
          aux ? aux->raw_data() : nullptr);
}

// For i < batch: C_i = alpha op(A_i) op(B_i) + beta C_i (f32, dense row-major matrices,
// op(A_i) m x k, op(B_i) k x n), the i-th matrices `stride` elements apart (0: one
// matrix for every i; with beta = 1 the products accumulate into one C).
void gemm_f32_strided(const char* op, bool ta, bool tb, std::int64_t m, std::int64_t n,
                      std::int64_t k, const Tensor& a, std::int64_t stride_a, const Tensor& b,
                      std::int64_t stride_b, float beta, Tensor& c, std::int64_t stride_c,
                      std::int64_t batch) {
  detail::Dispatch kd(op, &detail::KernelTable::gemm, {&a, &b, &c});
  kd->gemm_f32_strided(ta, tb, m, n, k, 1.f, a.data<float>(), ta ? m : k, stride_a, b.data<float>(),
                       tb ? k : n, stride_b, beta, c.data<float>(), n, stride_c, batch);
}

// The product, written in `dst` (f32, or the operands' dtype), unrecorded.
Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb, DType dst = DType::F32) {
  MatmulDims d = check_matmul(a, b, ta, tb);
  Shape out_shape = d.batch_shape;
  out_shape.push_back(d.m);
  out_shape.push_back(d.n);
  Tensor out = Tensor::empty(out_shape, dst, detail::op_device("matmul", {&a, &b}));
  const Tensor ag = gemm_operand(a), bg = gemm_operand(b);
  const DType src = gemm_dtype(a);
  // With a shared B and no transpose of A, the batch folds into M: one larger GEMM.
  if (d.b_shared && !ta && d.batch > 1) {
    run_gemm("matmul", {1, d.batch * d.m, d.n, d.k, false, tb, true, false, src, dst}, ag, bg,
             Tensor(), out);
  } else {
    run_gemm("matmul", {d.batch, d.m, d.n, d.k, ta, tb, d.b_shared, false, src, dst}, ag, bg,
             Tensor(), out);
  }
  return out;
}

}  // namespace

// The cotangent of matmul's right operand B given A, B, dC (shared: a 2-D B used by every
// batch of a batched A, whose cotangent sums over the batch). dC is in A's and B's dtype
// (cotangent_in); the result is f32.
static Tensor matmul_grad_b(const Tensor& ad, const Tensor& bd, const Tensor& gc, bool ta,
                            bool tb) {
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
      gb = Tensor::zeros(bd.shape(), DType::F32, bd.device());
      const std::int64_t m = gc.size(-2), n = gc.size(-1), k = ad.size(-2);
      const std::int64_t batch = gc.numel() / (m * n);
      if (tb)  // dB (N, K) += dC[i]^T A[i]^T
        gemm_f32_strided("matmul", true, true, n, k, m, gc, m * n, ad, k * m, 1.f, gb, 0, batch);
      else  // dB (K, N) += A[i] dC[i]
        gemm_f32_strided("matmul", false, false, k, n, m, ad, k * m, gc, m * n, 1.f, gb, 0, batch);
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
       bleaf = deferrable_weight(b, {a, b})](std::vector<Tensor>& g) {
        // Cotangents of bf16/f16 operands come back f32 (their astype's backward
        // keeps them f32 for the master weights).
        const Tensor gc = cotangent_in(g[0], ad.dtype());
        // Cast: the f32 cotangent goes before dA and dB are made (a language model's head:
        // B x T x V floats).
        if (!gc.shares_storage_with(g[0])) g[0] = Tensor();
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
            ga = Tensor::empty(ad.shape(), DType::F32, ad.device());
            const std::int64_t m = gc.size(-2), n = gc.size(-1), k = ad.size(-2);
            const std::int64_t batch = gc.numel() / (m * n);
            const Tensor b32 = astype(bd, DType::F32), g32 = astype(gc, DType::F32);
            gemm_f32_strided("matmul", tb, true, k, m, n, b32, 0, g32, m * n, 0.f, ga, k * m,
                             batch);
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

namespace {

void check_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& e) {
  check_operand_dtypes("linear", x, w);
  DISTJAX_CHECK(w.rank() == 2 && x.rank() >= 1 && x.size(-1) == w.size(0), InvalidArgument,
                "[linear] x ", to_string(x.shape()), " does not match kernel ",
                to_string(w.shape()), " (expected x (..., K), kernel (K, N))");
  if (bias.defined()) {
    detail::require_f32("linear", {&bias});
    DISTJAX_CHECK(bias.rank() == 1 && bias.size(0) == w.size(1), InvalidArgument, "[linear] bias ",
                  to_string(bias.shape()), " does not match kernel ", to_string(w.shape()));
  }
  DISTJAX_CHECK(e.out == DType::F32 || e.out == x.dtype(), InvalidArgument,
                "[linear] writes f32 or its operands' dtype (", dtype_name(x.dtype()), "), not ",
                dtype_name(e.out));
  if (e.residual.defined()) {
    Shape out_shape = x.shape();
    out_shape.back() = w.size(1);
    detail::require_f32("linear", {&e.residual});
    DISTJAX_CHECK(e.residual.shape() == out_shape, InvalidArgument, "[linear] residual ",
                  to_string(e.residual.shape()), " does not match the output ",
                  to_string(out_shape));
    DISTJAX_CHECK(e.out == DType::F32 && !e.gelu, InvalidArgument,
                  "[linear] adds a residual to an f32 output without GELU only");
  }
}

// The bias's cotangent, handed over now or, in a zero-bubble pipeline's B pass, queued for
// its W pass (`compute` runs there).
Tensor bias_cotangent(const std::shared_ptr<Node>& bleaf, std::function<Tensor()> compute) {
  WeightGradStore* store = weight_grad_store();
  if (!bleaf || !store) return compute();
  store->defer(bleaf, std::move(compute));
  return Tensor();
}

// What linear's backward makes from the cotangent g of its output (rows, n), in one
// epilogue_backward pass: the GEMMs' cotangent g2 (GELU's derivative applied with `pre`,
// rounded to the operands' dtype; g itself where it already is that) and the bias gradient
// (handed over now, or queued for a zero-bubble W pass). g's original goes once g2 is made.
struct LinearCotangent {
  Tensor g2, gbias;
};
LinearCotangent linear_cotangent(std::vector<Tensor>& g, const Tensor& pre, DType gemm_dtype,
                                 std::int64_t n, bool has_bias,
                                 const std::shared_ptr<Node>& bleaf) {
  const Tensor& gc = g[0];
  const std::int64_t rows = gc.numel() / n;
  const bool reuse = !pre.defined() && gc.dtype() == gemm_dtype;
  Tensor g2 = reuse ? gc.view({rows, n}) : Tensor::empty({rows, n}, gemm_dtype, gc.device());
  Tensor bsum = has_bias ? Tensor::empty({n}, DType::F32, gc.device()) : Tensor();
  if (!reuse || has_bias) {
    detail::Dispatch kd("linear_backward", &detail::KernelTable::gemm, {&gc, &pre, &g2, &bsum});
    kd->epilogue_backward(gc.raw_data(), gc.dtype(), pre.defined() ? pre.raw_data() : nullptr,
                          pre.defined() ? pre.dtype() : DType::F32, reuse ? nullptr : g2.raw_data(),
                          gemm_dtype, has_bias ? bsum.data<float>() : nullptr, rows, n);
  }
  // The sum is made: a zero-bubble W pass only hands it over.
  Tensor gbias = has_bias ? bias_cotangent(bleaf, [bsum] { return bsum; }) : Tensor();
  if (!reuse) g[0] = Tensor();
  return {g2, gbias};
}

// linear's products from g2 (rows, n): dx (in dx_dtype, shaped as x) and dW (undefined when
// deferred to a zero-bubble W pass), each where wanted.
std::pair<Tensor, Tensor> linear_products(const Tensor& g2, const Tensor& xd, const Tensor& wd,
                                          DType dx_dtype, bool rx, bool rw,
                                          const std::shared_ptr<Node>& wleaf) {
  const std::int64_t k = wd.size(0);
  Tensor x2 = xd.view({xd.numel() / k, k});
  Tensor dx = rx ? matmul_forward(g2, wd, false, true, dx_dtype).view(xd.shape()) : Tensor();
  Tensor dw;
  WeightGradStore* store = weight_grad_store();
  if (rw && wleaf && store)  // zero-bubble: dW later (W pass)
    store->defer(wleaf, [x2, g2] { return matmul(x2, g2, true, false); });
  else if (rw)
    dw = matmul(x2, g2, true, false);
  return {dx, dw};
}

// Whether linear's backward makes dW and the bias gradient in one product (the table's
// gemm_bias_grad) instead of a pass over the cotangent g for the bias and a product for dW:
// where g needs no pass of its own (no GELU, already in the operands' 16-bit dtype), both
// are wanted now (not queued for a zero-bubble W pass), and there is something to multiply.
// DISTJAX_BIAS_GRAD_IN_PRODUCT=0 takes the pass and the product instead (the benchmark's
// A/B of the two on a GPU; the CPU's bits are the same either way).
bool bias_grad_in_product_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DISTJAX_BIAS_GRAD_IN_PRODUCT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

bool bias_grad_in_product(const Tensor& g, const Tensor& pre, const Tensor& xd, bool has_bias,
                          bool rw, const std::shared_ptr<Node>& wleaf,
                          const std::shared_ptr<Node>& bleaf) {
  const bool queued = weight_grad_store() != nullptr && (wleaf || bleaf);
  return bias_grad_in_product_enabled() && has_bias && rw && !queued && !pre.defined() &&
         gemm_dtype(xd) != DType::F32 &&
         g.dtype() == xd.dtype() && xd.numel() > 0 && g.numel() > 0;
}

// dW = x2^T g2 (f32) and the bias gradient (g2's column sums) in one product.
std::pair<Tensor, Tensor> weight_and_bias_grads(const Tensor& x2, const Tensor& g2) {
  const std::int64_t rows = x2.size(0), k = x2.size(1), n = g2.size(1);
  Tensor dw = Tensor::empty({k, n}, DType::F32, x2.device());
  Tensor db = Tensor::empty({n}, DType::F32, x2.device());
  detail::Dispatch kd("linear_weight_grad", &detail::KernelTable::gemm, {&x2, &g2, &dw, &db});
  kd->gemm_bias_grad({1, k, n, rows, true, false, true, false, gemm_dtype(x2), DType::F32},
                     x2.raw_data(), g2.raw_data(), dw.raw_data(), db.data<float>());
  return {dw, db};
}

// linear's backward: dx, dW (or deferred), dbias and dresidual from the cotangent g of out
// (rows, n).
std::vector<Tensor> linear_backward(std::vector<Tensor>& g, const Tensor& xd, const Tensor& wd,
                                    const Tensor& pre, DType dx_dtype, bool has_bias,
                                    bool has_residual, bool rx, bool rw,
                                    const std::shared_ptr<Node>& wleaf,
                                    const std::shared_ptr<Node>& bleaf) {
  // The residual's cotangent is the output's own.
  const Tensor gresidual = has_residual ? g[0] : Tensor();
  std::vector<Tensor> out;
  if (bias_grad_in_product(g[0], pre, xd, has_bias, rw, wleaf, bleaf)) {
    const std::int64_t k = wd.size(0), n = wd.size(1);
    const Tensor g2 = g[0].view({g[0].numel() / n, n});
    Tensor dx = rx ? matmul_forward(g2, wd, false, true, dx_dtype).view(xd.shape()) : Tensor();
    auto [dw, db] = weight_and_bias_grads(xd.view({xd.numel() / k, k}), g2);
    out = {dx, dw, db};
  } else {
    const LinearCotangent c = linear_cotangent(g, pre, xd.dtype(), wd.size(1), has_bias, bleaf);
    auto [dx, dw] = linear_products(c.g2, xd, wd, dx_dtype, rx, rw, wleaf);
    out = {dx, dw};
    if (has_bias) out.push_back(c.gbias);  // undefined when deferred
  }
  if (has_residual) out.push_back(gresidual);
  return out;
}

// linear's forward, unrecorded: (..., N) in e.out, and GELU's pre-activation in *pre with
// e.gelu.
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& e,
                      Tensor* pre) {
  const std::int64_t k = w.size(0), n = w.size(1), m = x.numel() / std::max<std::int64_t>(k, 1);
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const Device dev = detail::op_device("linear", {&x, &w, &bias});
  Tensor out = Tensor::empty(out_shape, e.out, dev);
  if (e.gelu) *pre = Tensor::empty(out_shape, e.out, dev);
  run_gemm("linear", {1, m, n, k, false, false, true, bias.defined(), gemm_dtype(x), e.out, e.gelu},
           gemm_operand(x), gemm_operand(w), bias, out, e.gelu ? pre : nullptr, e.residual);
  return out;
}

// The dtype of the cotangent a backward hands x: x's own where its producer takes it so (a
// bf16 attention, a linear writing bf16): half the bytes, and the rounding it would do
// anyway; else f32.
DType cotangent_dtype(const Tensor& x) {
  return accepts_reduced_cotangent(x) ? x.dtype() : DType::F32;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  return linear(x, w, bias, LinearEpilogue{});
}

void matmul_into(const Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb,
                 bool accumulate) {
  check_defined(c, "matmul_into", "c");
  check_operand_dtypes("matmul_into", a, b);
  DISTJAX_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, InvalidArgument,
                "[matmul_into] takes matrices, got c ", to_string(c.shape()), ", a ",
                to_string(a.shape()), " and b ", to_string(b.shape()));
  const std::int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const std::int64_t n = tb ? b.size(0) : b.size(1);
  DISTJAX_CHECK((tb ? b.size(1) : b.size(0)) == k && c.size(0) == m && c.size(1) == n,
                InvalidArgument, "[matmul_into] c ", to_string(c.shape()), " is not a ",
                to_string(a.shape()), (ta ? "^T" : ""), " @ ", to_string(b.shape()),
                (tb ? "^T" : ""), " product");
  DISTJAX_CHECK(c.dtype() == DType::F32 || (!accumulate && c.dtype() == a.dtype()), InvalidArgument,
                "[matmul_into] writes f32",
                accumulate ? " when it accumulates" : " or its operands' dtype", ", not ",
                dtype_name(c.dtype()));
  if (m == 0 || n == 0 || (accumulate && k == 0)) return;
  DISTJAX_CHECK(!c.shares_storage_with(a) && !c.shares_storage_with(b), InvalidArgument,
                "[matmul_into] c shares memory with an operand");
  Tensor out = c;
  const detail::GemmKey key{1, m, n, k, ta, tb, true, false, gemm_dtype(a), c.dtype(), false};
  run_gemm("matmul_into", key, gemm_operand(a), gemm_operand(b), Tensor(), out, nullptr,
           accumulate ? c : Tensor());
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& e) {
  check_linear(x, w, bias, e);
  // No product to add to (K = 0): the add itself.
  if (e.residual.defined() && w.size(0) == 0) return add(e.residual, linear(x, w, bias));
  Tensor pre;
  Tensor out = linear_forward(x, w, bias, e, &pre);
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  if (e.residual.defined()) inputs.push_back(e.residual);
  if (!needs_grad(inputs)) return joined(out, inputs);
  Tensor y =
      record("linear", inputs, out,
             [xd = x.detach(), wd = w.detach(), pre, dx_dtype = cotangent_dtype(x),
              has_bias = bias.defined(), has_residual = e.residual.defined(),
              rx = x.requires_grad(), rw = w.requires_grad(), wleaf = deferrable_weight(w, inputs),
              bleaf = bias.defined() ? deferrable_weight(bias, inputs)
                                     : std::shared_ptr<Node>()](std::vector<Tensor>& g) {
               return linear_backward(g, xd, wd, pre, dx_dtype, has_bias, has_residual, rx, rw,
                                      wleaf, bleaf);
             });
  // Its backward reads a cotangent in its output's dtype as it reads an f32 one.
  return takes_reduced_cotangent(std::move(y));
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                const Tensor& b2, const Tensor& residual) {
  const LinearEpilogue e1{.gelu = true, .out = x.dtype()}, e2{.residual = residual};
  check_linear(x, w1, b1, e1);
  // Nothing to fuse in empty products: the two linears.
  if (x.numel() == 0 || w1.numel() == 0 || w2.numel() == 0)
    return linear(linear(x, w1, b1, e1), w2, b2, e2);
  Tensor pre;
  const Tensor a = linear_forward(x, w1, b1, e1, &pre);
  check_linear(a, w2, b2, e2);
  Tensor out = linear_forward(a, w2, b2, e2, nullptr);
  std::vector<Tensor> inputs{x, w1, w2};
  for (const Tensor* t : {&b1, &b2, &residual})
    if (t->defined()) inputs.push_back(*t);
  if (!needs_grad(inputs)) return joined(out, inputs);
  auto leaf = [&](const Tensor& t) {
    return t.defined() ? deferrable_weight(t, inputs) : std::shared_ptr<Node>();
  };
  return record(
      "gelu_mlp", inputs, out,
      [xd = x.detach(), w1d = w1.detach(), w2d = w2.detach(), a, pre, dx_dtype = cotangent_dtype(x),
       has_b1 = b1.defined(), has_b2 = b2.defined(), has_residual = residual.defined(),
       rx = x.requires_grad(), rw1 = w1.requires_grad(), rw2 = w2.requires_grad(),
       w1leaf = leaf(w1), w2leaf = leaf(w2), b1leaf = leaf(b1),
       b2leaf = leaf(b2)](std::vector<Tensor>& g) {
        const Tensor gresidual = has_residual ? g[0] : Tensor();
        const std::int64_t h = w2d.size(0), n = w2d.size(1), rows = a.numel() / h;
        // fc2: its cotangent's pass (rounding, bias gradient) and dW2.
        LinearCotangent c2 = linear_cotangent(g, Tensor(), a.dtype(), n, has_b2, b2leaf);
        Tensor dw2 = linear_products(c2.g2, a, w2d, DType::F32, false, rw2, w2leaf).second;
        // fc2's dX with GELU's derivative and fc1's bias gradient in its epilogue: the
        // cotangent of fc1's pre-activation, in the operands' dtype.
        const Tensor d = Tensor::empty({rows, h}, a.dtype(), a.device());
        const Tensor db1 = has_b1 ? Tensor::empty({h}, DType::F32, a.device()) : Tensor();
        {
          const Tensor g2 = gemm_operand(c2.g2), w2g = gemm_operand(w2d);
          detail::Dispatch kd("gelu_mlp", &detail::KernelTable::gemm, {&g2, &w2g, &pre, &d, &db1});
          kd->gemm_dgelu({1, rows, h, n, false, true, true, false, gemm_dtype(a), a.dtype(), false},
                         g2.raw_data(), w2g.raw_data(), pre.raw_data(), d.raw_data(),
                         has_b1 ? db1.data<float>() : nullptr);
        }
        c2.g2 = Tensor();  // dx and dW1 read d only
        const Tensor gb1 = has_b1 ? bias_cotangent(b1leaf, [db1] { return db1; }) : Tensor();
        auto [dx, dw1] = linear_products(d, xd, w1d, dx_dtype, rx, rw1, w1leaf);
        std::vector<Tensor> out{dx, dw1, dw2};
        if (has_b1) out.push_back(gb1);
        if (has_b2) out.push_back(c2.gbias);
        if (has_residual) out.push_back(gresidual);
        return out;
      });
}

}  // namespace distjax::tensor
