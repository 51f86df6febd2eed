// Fused NN ops over rows: x (..., C) is viewed as (N, C); the ops check shapes, allocate
// on their inputs' device and dispatch the nn family (tensor/cpu/nn.cpp holds the CPU
// kernels). Each op's backward follows its forward.
#include "distjax/tensor/nn_ops.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::Dispatch;
using detail::KernelTable;

// x (..., C) viewed as n rows of c. Callers copy n and c into variables rather than bind
// them (auto [n, c]): clang before 16 cannot use a structured binding inside a lambda.
struct RowsOf {
  std::int64_t n, c;
};

RowsOf as_rows(const Tensor& x) {
  const std::int64_t c = x.rank() ? x.size(-1) : 1;
  return {c ? x.numel() / c : 0, c};
}

void check_vector(const char* op, const char* what, const Tensor& p, std::int64_t c,
                  const Tensor& x) {
  detail::require_f32(op, {&p});
  DISTJAX_CHECK(p.rank() == 1 && p.size(0) == c, InvalidArgument, "[", op, "] ", what,
                " has shape ", to_string(p.shape()), " but x ", to_string(x.shape()), " needs (", c,
                ")");
}

// Moves `axis` last (and back): softmax over another axis is the last-axis kernel
// between two differentiable permutes.
std::vector<int> axis_last_perm(int rank, int axis) {
  std::vector<int> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + axis);
  perm.push_back(axis);
  return perm;
}

// ------------------------------------------------------------------ softmax

Tensor softmax_last(const Tensor& x, bool log_form) {
  const char* op = log_form ? "log_softmax" : "softmax";
  const RowsOf rc = as_rows(x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  {
    Dispatch k(op, &KernelTable::nn, {&x, &y});
    k->softmax(x.data<float>(), y.data<float>(), rc.n, rc.c, log_form);
  }
  if (!needs_grad({&x})) return joined(y, {&x});
  return record(op, {x}, y, [op, yd = y.detach(), log_form](const std::vector<Tensor>& g) {
    const RowsOf rc = as_rows(yd);
    Tensor gx = Tensor::empty(yd.shape(), DType::F32, yd.device());
    Dispatch k(op, &KernelTable::nn, {&yd, &g[0], &gx});
    k->softmax_backward(yd.data<float>(), g[0].data<float>(), gx.data<float>(), rc.n, rc.c,
                        log_form);
    return std::vector<Tensor>{gx};
  });
}

Tensor softmax_axis(const Tensor& x, int axis_in, bool log_form) {
  const char* op = log_form ? "log_softmax" : "softmax";
  detail::require_f32(op, {&x});
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[", op, "] needs rank >= 1, got a scalar");
  const int axis = normalize_axis(axis_in, x.rank(), op);
  if (axis == x.rank() - 1) return softmax_last(x, log_form);
  const std::vector<int> perm = axis_last_perm(x.rank(), axis);
  std::vector<int> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inv[perm[i]] = static_cast<int>(i);
  return permute(softmax_last(permute(x, perm), log_form), inv);
}

}  // namespace

Tensor softmax(const Tensor& x, int axis) {
  return softmax_axis(x, axis, false);
}
Tensor log_softmax(const Tensor& x, int axis) {
  return softmax_axis(x, axis, true);
}

// ------------------------------------------------------------------ layer norm

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, DType out) {
  detail::require_f32("layer_norm", {&x});
  DISTJAX_CHECK(is_floating(out), InvalidArgument, "[layer_norm] writes f32, bf16 or f16, not ",
                dtype_name(out));
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[layer_norm] needs x of rank >= 1, got a scalar");
  const RowsOf rc = as_rows(x);
  const std::int64_t n = rc.n, c = rc.c;
  check_vector("layer_norm", "gamma", gamma, c, x);
  if (beta.defined()) check_vector("layer_norm", "beta", beta, c, x);
  const Device dev = detail::op_device("layer_norm", {&x, &gamma, &beta});
  // bf16 written by the kernel where the device has one; else the f32 op and its cast.
  const detail::NnKernels* fam = detail::kernel_table(dev.kind).nn;
  const bool fused = out == DType::BF16 && fam != nullptr && fam->layer_norm_bf16 != nullptr;
  if (out != DType::F32 && !fused) return astype(layer_norm(x, gamma, beta, eps), out);
  Tensor y = Tensor::empty(x.shape(), fused ? DType::BF16 : DType::F32, dev);
  Tensor mean = Tensor::empty({n}, DType::F32, dev), rstd = Tensor::empty({n}, DType::F32, dev);
  {
    Dispatch k("layer_norm", &KernelTable::nn, {&x, &gamma, &beta, &y, &mean, &rstd});
    const float* pb = beta.defined() ? beta.data<float>() : nullptr;
    if (fused)
      k->layer_norm_bf16(x.data<float>(), gamma.data<float>(), pb, y.data<bf16>(),
                         mean.data<float>(), rstd.data<float>(), n, c, eps);
    else
      k->layer_norm(x.data<float>(), gamma.data<float>(), pb, y.data<float>(), mean.data<float>(),
                    rstd.data<float>(), n, c, eps);
  }
  std::vector<Tensor> inputs{x, gamma};
  if (beta.defined()) inputs.push_back(beta);
  if (!needs_grad(inputs)) return joined(y, inputs);
  // A bf16 y's cotangent is read as it comes (f32 or bf16) where the device has a kernel for
  // a bf16 one: then the matmul that read y may write it in bf16 (Node::reduced_cotangent).
  const bool bf16_cotangent = fused && fam->layer_norm_backward_bf16 != nullptr;
  // x's cotangent is added into the one the tape has summed for x so far (the residual
  // connection's, when the norm follows one) in the same pass: Node::backward_adding.
  Node::AddingBackwardFn backward = [xd = x.detach(), wd = gamma.detach(), mean, rstd,
                                     has_beta = beta.defined(), rx = x.requires_grad(),
                                     bf16_cotangent](std::vector<Tensor>& g, Tensor partial) {
    const RowsOf rc = as_rows(xd);
    const Device dev = xd.device();
    // In the partial's memory where it is the pass's alone.
    Tensor gx = !rx                    ? Tensor()
                : partial.sole_owner() ? partial
                                       : Tensor::empty(xd.shape(), DType::F32, dev);
    Tensor gw = Tensor::empty({rc.c}, DType::F32, dev);
    Tensor gb = has_beta ? Tensor::empty({rc.c}, DType::F32, dev) : Tensor();
    const bool g16 = bf16_cotangent && g[0].dtype() == DType::BF16;
    const Tensor g0 = g16 ? g[0] : astype(g[0], DType::F32);
    Dispatch k("layer_norm", &KernelTable::nn,
               {&xd, &wd, &g0, &mean, &rstd, &gx, &partial, &gw, &gb});
    float* pgx = rx ? gx.data<float>() : nullptr;
    const float* padd = rx && partial.defined() ? partial.data<float>() : nullptr;
    float* pgb = has_beta ? gb.data<float>() : nullptr;
    if (g16)
      k->layer_norm_backward_bf16(xd.data<float>(), wd.data<float>(), g0.data<bf16>(),
                                  mean.data<float>(), rstd.data<float>(), pgx, padd,
                                  gw.data<float>(), pgb, rc.n, rc.c);
    else
      k->layer_norm_backward(xd.data<float>(), wd.data<float>(), g0.data<float>(),
                             mean.data<float>(), rstd.data<float>(), pgx, padd, gw.data<float>(),
                             pgb, rc.n, rc.c);
    // Without a cotangent of its own for x, the partial stays x's.
    std::vector<Tensor> out{rx ? gx : partial, gw};
    if (has_beta) out.push_back(gb);
    return out;
  };
  Tensor result = record("layer_norm", inputs, y,
                         [backward](std::vector<Tensor>& g) { return backward(g, Tensor()); });
  if (result.grad_node()) result.grad_node()->backward_adding = std::move(backward);
  return bf16_cotangent ? takes_reduced_cotangent(std::move(result)) : result;
}

// ------------------------------------------------------------------ RMS norm

Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  detail::require_f32("rms_norm", {&x});
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[rms_norm] needs x of rank >= 1, got a scalar");
  const RowsOf rc = as_rows(x);
  const std::int64_t n = rc.n, c = rc.c;
  check_vector("rms_norm", "gamma", gamma, c, x);
  const Device dev = detail::op_device("rms_norm", {&x, &gamma});
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  Tensor rrms = Tensor::empty({n}, DType::F32, dev);
  {
    Dispatch k("rms_norm", &KernelTable::nn, {&x, &gamma, &y, &rrms});
    k->rms_norm(x.data<float>(), gamma.data<float>(), y.data<float>(), rrms.data<float>(), n, c,
                eps);
  }
  if (!needs_grad({&x, &gamma})) return joined(y, {&x, &gamma});
  return record("rms_norm", {x, gamma}, y,
                [xd = x.detach(), wd = gamma.detach(), rrms,
                 rx = x.requires_grad()](const std::vector<Tensor>& g) {
                  const RowsOf rc = as_rows(xd);
                  const Device dev = xd.device();
                  Tensor gx = rx ? Tensor::empty(xd.shape(), DType::F32, dev) : Tensor();
                  Tensor gw = Tensor::empty({rc.c}, DType::F32, dev);
                  Dispatch k("rms_norm", &KernelTable::nn, {&xd, &wd, &g[0], &rrms, &gx, &gw});
                  k->rms_norm_backward(xd.data<float>(), wd.data<float>(), g[0].data<float>(),
                                       rrms.data<float>(), rx ? gx.data<float>() : nullptr,
                                       gw.data<float>(), rc.n, rc.c);
                  return std::vector<Tensor>{gx, gw};
                });
}

// ------------------------------------------------------------------ embedding

namespace {

// Checks that `ids` holds integers in [0, v): on the CPU at once; on another device the
// verdict is read with the next read from it (raise_deferred_errors), so the op makes the
// host wait for nothing.
void check_ids(const char* op, const Tensor& ids, std::int64_t v, const char* what) {
  check_defined(ids, op, "ids");
  DISTJAX_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, InvalidArgument, "[", op,
                "] ids/labels must be i32 or i64, got ", dtype_name(ids.dtype()));
  Tensor bad = Tensor::empty({2}, DType::I64, ids.device());
  {
    Dispatch k(op, &KernelTable::nn, {&ids, &bad});
    k->find_bad_id(ids.raw_data(), ids.dtype(), ids.numel(), v, bad.data<std::int64_t>());
  }
  if (ids.device().kind != DeviceKind::CPU) {
    detail::defer_id_check(op, what, std::move(bad), v);
    return;
  }
  const std::vector<std::int64_t> b = bad.to_vector<std::int64_t>();
  DISTJAX_CHECK(b[0] < 0, InvalidArgument, "[", op, "] ", what, " ", b[1], " at flat index ", b[0],
                " is outside [0, ", v, ")");
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  detail::require_f32("embedding", {&table});
  DISTJAX_CHECK(table.rank() == 2, InvalidArgument, "[embedding] table must be (V, C), got ",
                to_string(table.shape()));
  const std::int64_t v = table.size(0), c = table.size(1);
  check_ids("embedding", ids, v, "id");
  Shape os = ids.shape();
  os.push_back(c);
  Tensor out = Tensor::empty(os, DType::F32, detail::op_device("embedding", {&table, &ids}));
  {
    Dispatch k("embedding", &KernelTable::nn, {&table, &ids, &out});
    k->embedding(table.data<float>(), ids.raw_data(), ids.dtype(), out.data<float>(), ids.numel(),
                 c, v);
  }
  // ids join the varying axes (a batch sharded over "data" gives rows that vary over it).
  if (!needs_grad({&table})) return joined(out, {&table, &ids});
  return record("embedding", {table, ids}, out,
                [idd = ids.detach(), v, c](const std::vector<Tensor>& g) {
                  Tensor gt = Tensor::zeros({v, c}, DType::F32, idd.device());
                  Dispatch k("embedding", &KernelTable::nn, {&g[0], &idd, &gt});
                  k->embedding_backward(g[0].data<float>(), idd.raw_data(), idd.dtype(),
                                        gt.data<float>(), idd.numel(), c, v);
                  return std::vector<Tensor>{gt, Tensor()};
                });
}

// ------------------------------------------------------------------ cross-entropy

namespace {

// The loss (n) and row log-sum-exp (n) of n rows of v logits against their labels (checked
// by the caller).
void cross_entropy_rows(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                        const Tensor& lse, std::int64_t n, std::int64_t v) {
  Dispatch k("cross_entropy", &KernelTable::nn, {&logits, &labels, &loss, &lse});
  k->cross_entropy(logits.data<float>(), labels.raw_data(), labels.dtype(), loss.data<float>(),
                   lse.data<float>(), n, v);
}

// gx = g * (softmax(logits) - onehot(label)) per row, rebuilt from lse; gx may be the logits
// themselves (the kernel reads each logit before it writes its gradient).
void cross_entropy_rows_backward(const Tensor& logits, const Tensor& g, const Tensor& lse,
                                 const Tensor& labels, const Tensor& gx, std::int64_t n,
                                 std::int64_t v) {
  const bool over = gx.raw_data() == logits.raw_data();
  Dispatch k("cross_entropy", &KernelTable::nn,
             over ? std::vector<const Tensor*>{&logits, &g, &lse, &labels}
                  : std::vector<const Tensor*>{&logits, &g, &lse, &labels, &gx});
  k->cross_entropy_backward(logits.data<float>(), g.data<float>(), lse.data<float>(),
                            labels.raw_data(), labels.dtype(), gx.data<float>(), n, v);
}

// Both in one pass (the chunked head's): loss and lse of f32 or bf16 logits, and gx = g *
// (softmax(logits) - onehot(label)) written in gx's dtype; gx may be the logits themselves
// where the dtypes agree.
void cross_entropy_rows_with_grad(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                                  const Tensor& lse, const Tensor& g, const Tensor& gx,
                                  std::int64_t n, std::int64_t v) {
  const bool over = gx.raw_data() == logits.raw_data();
  Dispatch k("cross_entropy", &KernelTable::nn,
             over ? std::vector<const Tensor*>{&logits, &labels, &loss, &lse, &g}
                  : std::vector<const Tensor*>{&logits, &labels, &loss, &lse, &g, &gx});
  k->cross_entropy_with_grad(logits.raw_data(), logits.dtype(), labels.raw_data(), labels.dtype(),
                             loss.data<float>(), lse.data<float>(), g.data<float>(), gx.raw_data(),
                             gx.dtype(), n, v);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  detail::require_f32("cross_entropy", {&logits});
  DISTJAX_CHECK(logits.rank() >= 1, InvalidArgument,
                "[cross_entropy] logits need rank >= 1, got a scalar");
  Shape ls(logits.shape().begin(), logits.shape().end() - 1);
  check_defined(labels, "cross_entropy", "labels");
  DISTJAX_CHECK(labels.shape() == ls, InvalidArgument, "[cross_entropy] labels ",
                to_string(labels.shape()), " do not match logits ", to_string(logits.shape()),
                " (expected labels ", to_string(ls), ")");
  const RowsOf rc = as_rows(logits);
  const std::int64_t n = rc.n, v = rc.c;
  check_ids("cross_entropy", labels, v, "label");
  const Device dev = detail::op_device("cross_entropy", {&logits, &labels});
  Tensor loss = Tensor::empty(ls, DType::F32, dev);
  Tensor lse = Tensor::empty({n}, DType::F32, dev);
  cross_entropy_rows(logits, labels, loss, lse, n, v);
  if (!needs_grad({&logits})) return joined(loss, {&logits, &labels});
  return record("cross_entropy", {logits, labels}, loss,
                [xd = logits.detach(), lse, ld = labels.detach()](const std::vector<Tensor>& g) {
                  const RowsOf rc = as_rows(xd);
                  // The logits are usually the largest tensor of a language model's step
                  // (B x T x V): when only the tape kept them, their gradient takes their
                  // memory (the kernel reads each logit before it writes its gradient).
                  Tensor gx =
                      xd.sole_owner() ? xd : Tensor::empty(xd.shape(), DType::F32, xd.device());
                  cross_entropy_rows_backward(xd, g[0], lse, ld, gx, rc.n, rc.c);
                  return std::vector<Tensor>{gx, Tensor()};
                });
}

// ------------------------------------------------------------------ head + cross-entropy

Tensor linear_cross_entropy_mean(const Tensor& x, const Tensor& w, const Tensor& labels,
                                 bool trans_w, std::int64_t chunk_bytes) {
  const char* op = "linear_cross_entropy_mean";
  check_defined(x, op, "x");
  check_defined(w, op, "w");
  check_defined(labels, op, "labels");
  DISTJAX_CHECK(x.rank() >= 1 && w.rank() == 2 && x.size(-1) == w.size(trans_w ? 1 : 0),
                InvalidArgument, "[", op, "] x ", to_string(x.shape()), " does not match w ",
                to_string(w.shape()), trans_w ? " (expected w (V, K))" : " (expected w (K, V))");
  DISTJAX_CHECK(x.dtype() == w.dtype() && is_floating(x.dtype()), InvalidArgument, "[", op,
                "] x and w must share a floating dtype, got ", dtype_name(x.dtype()), " and ",
                dtype_name(w.dtype()));
  const Shape ls(x.shape().begin(), x.shape().end() - 1);
  DISTJAX_CHECK(labels.shape() == ls, InvalidArgument, "[", op, "] labels ",
                to_string(labels.shape()), " do not match x ", to_string(x.shape()),
                " (expected labels ", to_string(ls), ")");
  DISTJAX_CHECK(chunk_bytes > 0, InvalidArgument, "[", op, "] chunk_bytes must be > 0");
  const std::int64_t k = x.size(-1), v = w.size(trans_w ? 0 : 1);
  const std::int64_t rows = numel(ls);
  DISTJAX_CHECK(rows > 0 && v > 0, InvalidArgument, "[", op, "] needs rows and classes, got x ",
                to_string(x.shape()), " and w ", to_string(w.shape()));
  const Device dev = detail::op_device(op, {&x, &w, &labels});
  const bool gx = needs_grad({&x}), gw = needs_grad({&w});
  // The logits: f32, or bf16 for bf16 products (the GEMM rounds its f32 sums once, as
  // every bf16 layer's output; the loss is taken in f32 from them).
  const DType logits_dtype = x.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  const std::int64_t chunk = std::clamp<std::int64_t>(
      chunk_bytes / (v * static_cast<std::int64_t>(dtype_size(logits_dtype))), 1, rows);
  const Tensor x2 = x.detach().view({rows, k}), l2 = labels.detach().view({rows}), wd = w.detach();
  check_ids(op, l2, v, "label");
  // Per row: the loss; the gradients for a cotangent of 1, filled chunk by chunk: dx's rows
  // written in place, dw's products added into it by the GEMMs; the rows' weight in the
  // mean, 1 / rows, is the logits' cotangent. dx comes in bf16 where x's producer takes its
  // cotangent so (Node::reduced_cotangent: half the bytes, the rounding its GEMM would do);
  // an f16 dx stays f32, since its values lie below f16's range until a loss scale
  // multiplies them.
  const DType dx_dtype =
      x.dtype() == DType::BF16 && accepts_reduced_cotangent(x) ? DType::BF16 : DType::F32;
  const Tensor loss = Tensor::empty({rows}, DType::F32, dev);
  const Tensor dx = gx ? Tensor::empty({rows, k}, dx_dtype, dev) : Tensor();
  const Tensor dw = gw ? Tensor::empty(w.shape(), DType::F32, dev) : Tensor();
  const Tensor weight =
      gx || gw ? Tensor::full({chunk}, 1.0 / static_cast<double>(rows), DType::F32, dev) : Tensor();
  {
    NoGradGuard no_grad;  // the chunks' ops are not recorded; this op is, below
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      const Tensor xc = x2.view_rows(r0, r0 + n), lc = l2.view_rows(r0, r0 + n);
      Tensor logits = Tensor::empty({n, v}, logits_dtype, dev);
      matmul_into(logits, xc, wd, false, trans_w);
      const Tensor lse = Tensor::empty({n}, DType::F32, dev);
      if (!gx && !gw) {  // the loss of the same logits, widened (exactly) for the kernel
        cross_entropy_rows(logits_dtype == DType::F32 ? logits : astype(logits, DType::F32), lc,
                           loss.view_rows(r0, r0 + n), lse, n, v);
        continue;
      }
      // The loss and the logits' cotangent in the products' dtype, one pass over the logits
      // (over their memory where the dtypes agree).
      const Tensor dl = x.dtype() == logits_dtype ? logits : Tensor::empty({n, v}, x.dtype(), dev);
      cross_entropy_rows_with_grad(logits, lc, loss.view_rows(r0, r0 + n), lse,
                                   weight.view_rows(0, n), dl, n, v);
      logits = Tensor();  // the logits go before the products (unless dl is them)
      if (gx) matmul_into(dx.view_rows(r0, r0 + n), dl, wd, false, !trans_w);  // (n, K)
      if (gw) {
        if (trans_w)
          matmul_into(dw, dl, xc, true, false, /*accumulate=*/r0 > 0);  // (V, K)
        else
          matmul_into(dw, xc, dl, true, false, /*accumulate=*/r0 > 0);  // (K, V)
      }
    }
  }
  Tensor mean_loss = mean(loss);
  if (!gx && !gw) return joined(mean_loss, {&x, &w});
  const Tensor dx_out = gx ? dx.view(x.shape()) : Tensor();
  return record(op, {x, w}, mean_loss, [dx_out, dw](const std::vector<Tensor>& g) {
    // Scaled by the loss's cotangent in place: the tape runs this once, and these buffers
    // are this op's alone.
    for (const Tensor* t : {&dx_out, &dw})
      if (t->defined()) scale_into(*t, g[0]);
    return std::vector<Tensor>{dx_out, dw};
  });
}

// ------------------------------------------------------------------ dropout

namespace {

// Inverted dropout of x with the mask `mask` draws (at `run_offsets`, when defined): the
// backward draws the same mask again rather than keeping it.
Tensor dropout_with_mask(const Tensor& x, const detail::DropoutMask& mask,
                         const Tensor& run_offsets) {
  auto apply = [mask, run_offsets](const Tensor& src) {
    Tensor dst = Tensor::empty(src.shape(), DType::F32, src.device());
    Dispatch k("dropout", &KernelTable::nn, {&src, &run_offsets, &dst});
    k->dropout(src.data<float>(), dst.data<float>(), src.numel(), mask,
               run_offsets.defined() ? run_offsets.data<std::int64_t>() : nullptr);
    return dst;
  };
  Tensor y = apply(x);
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("dropout", {x}, y,
                [apply](const std::vector<Tensor>& g) { return std::vector<Tensor>{apply(g[0])}; });
}

detail::DropoutMask dropout_mask(const Key& key, float rate, std::int64_t run) {
  return {key, 1.f - rate, 1.f / (1.f - rate), run};
}

void check_rate(const Tensor& x, float rate) {
  detail::require_f32("dropout", {&x});
  DISTJAX_CHECK(rate >= 0.f && rate < 1.f, InvalidArgument,
                "[dropout] rate must be in [0, 1), got ", rate);
}

}  // namespace

Tensor dropout(const Tensor& x, float rate, const Key& key) {
  check_rate(x, rate);
  if (rate == 0.f) return x;
  return dropout_with_mask(x, dropout_mask(key, rate, x.numel()), Tensor());
}

Tensor dropout(const Tensor& x, float rate, const Key& key, const Shape& global,
               const std::vector<std::int64_t>& block_start) {
  check_rate(x, rate);
  const int r = x.rank();
  bool inside =
      r >= 1 && static_cast<int>(global.size()) == r && static_cast<int>(block_start.size()) == r;
  for (int d = 0; inside && d < r; ++d)
    inside = block_start[d] >= 0 && block_start[d] + x.size(d) <= global[d];
  DISTJAX_CHECK(inside, InvalidArgument, "[dropout] block ", to_string(x.shape()),
                " does not lie inside ", to_string(global), " at the given start");
  if (rate == 0.f) return x;
  const std::int64_t n = x.numel(), row = x.size(r - 1);
  // Each contiguous row of the block draws its stream positions from the global index
  // (shapes only: computed on the host, one copy to the device).
  std::vector<std::int64_t> offsets;
  for (std::int64_t local = 0; local < n; local += row) {
    std::int64_t g = 0, stride = global[r - 1], rem = local / row;
    for (int d = r - 1; d-- > 0;) {
      g += (block_start[d] + rem % x.size(d)) * stride;
      rem /= x.size(d);
      stride *= global[d];
    }
    offsets.push_back(g + block_start[r - 1]);
  }
  const Tensor run_offsets =
      Tensor::from_vector(offsets, {static_cast<std::int64_t>(offsets.size())}, x.device());
  return dropout_with_mask(x, dropout_mask(key, rate, row), run_offsets);
}

}  // namespace distjax::tensor
