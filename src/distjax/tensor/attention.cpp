// Fused multi-head attention: the ops check shapes, lay out the heads (AttentionPlan) and
// dispatch the attention family (tensor/cpu/attention.cpp holds the CPU kernels). The
// forward saves the row log-sum-exp; the backward recomputes the probabilities from it.
// A bf16 plan that the device's bf16 entries serve (cuDNN's fused attention on CUDA) runs
// on bf16 copies of q, k, v, which the backward keeps instead of the f32 operands.
// Document ids travel in the plan (a pointer into the segments tensor, which every closure
// that holds the plan keeps alive).
#include "distjax/tensor/attention.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/host_access.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::AttentionPlan;
using detail::Dispatch;
using detail::KernelTable;

// Whether the products may read bf16 operands, from the compute dtype (checked).
bool bf16_products(DType compute, const char* op) {
  DISTJAX_CHECK(compute == DType::F32 || compute == DType::BF16 || compute == DType::F16,
                InvalidArgument, "[", op, "] computes in f32, bf16 or f16, not ",
                dtype_name(compute));
  return compute == DType::BF16;
}

float default_scale(float scale, std::int64_t d) {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(std::max<std::int64_t>(d, 1)));
}

// Whether the device's attention family takes bf16 operands for plan `a` (the bf16
// policy's attention where a bf16 library serves it: cuDNN's SDPA on CUDA): the op then
// hands it bf16 copies of q, k, v and saves those, not the f32 operands, for the backward.
bool runs_bf16(const AttentionPlan& a, Device dev) {
  if (!a.bf16_products) return false;
  const detail::AttentionKernels* f = detail::kernel_table(dev.kind).attention;
  return f != nullptr && f->serves_bf16 != nullptr && f->forward_bf16 != nullptr &&
         f->backward_bf16 != nullptr && f->serves_bf16(a);
}

Tensor to_bf16(const Tensor& x) {
  return astype(x.detach(), DType::BF16);
}

void check_out(DType out, const char* op) {
  DISTJAX_CHECK(is_floating(out), InvalidArgument, "[", op, "] writes f32, bf16 or f16, not ",
                dtype_name(out));
}

// Points plan `a` at the document ids `seg` (when defined): i32 (B, T), self-attention
// (T == S), H heads per batch row.
void set_segments(AttentionPlan& a, const Tensor& seg, std::int64_t b, std::int64_t h,
                  const char* op) {
  if (!seg.defined()) return;
  DISTJAX_CHECK(
      seg.dtype() == DType::I32 && seg.rank() == 2 && seg.size(0) == b && seg.size(1) == a.t,
      InvalidArgument, "[", op, "] expected document ids i32 (B, T) = (", b, ", ", a.t, "), got ",
      dtype_name(seg.dtype()), " ", to_string(seg.shape()));
  DISTJAX_CHECK(a.t == a.s, InvalidArgument, "[", op,
                "] document ids need self-attention (T == S), got T ", a.t, ", S ", a.s);
  a.segments = seg.data<std::int32_t>();
  a.segment_heads = h;
}

AttentionPlan check_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              float scale, DType compute, const Tensor& seg) {
  detail::require_f32("attention", {&q, &k, &v});
  DISTJAX_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, InvalidArgument,
                "[attention] expected q (B, H, T, D), k and v (B, H, S, D), got q ",
                to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()));
  DISTJAX_CHECK(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                    q.size(3) == k.size(3),
                InvalidArgument, "[attention] shapes do not match: q ", to_string(q.shape()),
                ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
                " (expected q (B, H, T, D), k and v (B, H, S, D))");
  AttentionPlan a;
  a.bh = q.size(0) * q.size(1);
  a.t = q.size(2);
  a.s = k.size(2);
  a.d = q.size(3);
  a.ldq = a.ldkv = a.ldo = a.d;
  // The (B, H, T, D) layout of q and o, (B, H, S, D) of k and v: head h at h T D, h S D.
  a.heads = 1;
  a.q_b = a.o_b = a.t * a.d;
  a.kv_b = a.s * a.d;
  a.q_h = a.kv_h = a.o_h = 0;
  a.causal = causal;
  a.scale = default_scale(scale, a.d);
  a.bf16_products = bf16_products(compute, "attention");
  set_segments(a, seg, q.size(0), q.size(1), "attention");
  return a;
}

// attention() through the bf16 entries: q, k, v rounded to bf16 (and saved so), o
// widened back to f32, the cotangents rounded and the gradients widened.
Tensor attention_bf16(const AttentionPlan& a, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& seg, Device dev, DType out_dtype) {
  const Tensor q16 = to_bf16(q), k16 = to_bf16(k), v16 = to_bf16(v);
  Tensor o16 = Tensor::empty(q.shape(), DType::BF16, dev);
  Tensor lse = Tensor::empty({q.size(0), q.size(1), a.t}, DType::F32, dev);
  {
    Dispatch kd("attention", &KernelTable::attention, {&q16, &k16, &v16, &o16, &lse, &seg});
    kd->forward_bf16(a, q16.data<bf16>(), k16.data<bf16>(), v16.data<bf16>(), o16.data<bf16>(),
                     lse.data<float>());
  }
  Tensor out = astype(o16, out_dtype);  // o16 itself for a bf16 `out`
  if (!needs_grad({&q, &k, &v})) return joined(out, {&q, &k, &v});
  return takes_reduced_cotangent(
      record("attention", {q, k, v}, out,
             [a, q16, k16, v16, o16 = o16.detach(), lse,
              seg = seg.detach()](const std::vector<Tensor>& g) {
               const Device dev = q16.device();
               const Tensor g16 = to_bf16(g[0]);
               Tensor gq = Tensor::empty(q16.shape(), DType::BF16, dev),
                      gk = Tensor::empty(k16.shape(), DType::BF16, dev),
                      gv = Tensor::empty(v16.shape(), DType::BF16, dev);
               Dispatch k("attention_backward", &KernelTable::attention,
                          {&q16, &k16, &v16, &o16, &lse, &g16, &gq, &gk, &gv, &seg});
               k->backward_bf16(a, q16.data<bf16>(), k16.data<bf16>(), v16.data<bf16>(),
                                o16.data<bf16>(), lse.data<float>(), g16.data<bf16>(),
                                gq.data<bf16>(), gk.data<bf16>(), gv.data<bf16>());
               return std::vector<Tensor>{astype(gq, DType::F32), astype(gk, DType::F32),
                                          astype(gv, DType::F32)};
             }));
}

// attention_packed() through the bf16 entries: one bf16 copy of the packed projection.
Tensor attention_packed_bf16(const AttentionPlan& a, const Tensor& qkv, const Tensor& seg,
                             const Shape& out_shape, DType out_dtype) {
  const Device dev = qkv.device();
  const Tensor x16 = to_bf16(qkv);
  Tensor o16 = Tensor::empty(out_shape, DType::BF16, dev);
  Tensor lse = Tensor::empty({a.bh / a.heads, a.heads, a.t}, DType::F32, dev);
  {
    Dispatch kd("attention_packed", &KernelTable::attention, {&x16, &o16, &lse, &seg});
    const bf16* p = x16.data<bf16>();
    kd->forward_bf16(a, p, p + a.d, p + 2 * a.d, o16.data<bf16>(), lse.data<float>());
  }
  Tensor out = astype(o16, out_dtype);  // o16 itself for a bf16 `out`
  if (!needs_grad({&qkv})) return joined(out, {&qkv});
  return takes_reduced_cotangent(
      record("attention_packed", {qkv}, out,
             [a, x16, o16 = o16.detach(), lse, seg = seg.detach(),
              from = qkv.dtype()](const std::vector<Tensor>& g) {
               const Tensor g16 = to_bf16(g[0]);
               Tensor gx = Tensor::empty(x16.shape(), DType::BF16, x16.device());
               Dispatch k("attention_packed_backward", &KernelTable::attention,
                          {&x16, &o16, &lse, &g16, &gx, &seg});
               const bf16* px = x16.data<bf16>();
               bf16* pgx = gx.data<bf16>();
               k->backward_bf16(a, px, px + a.d, px + 2 * a.d, o16.data<bf16>(), lse.data<float>(),
                                g16.data<bf16>(), pgx, pgx + a.d, pgx + 2 * a.d);
               // The cotangent in qkv's own dtype: bf16 for a bf16 projection.
               return std::vector<Tensor>{astype(gx, from)};
             }));
}

// attention() through the f32 entries (the bf16 policy's products computed by the device
// as it can): the f32 operands and output are saved for the backward.
Tensor attention_f32(const AttentionPlan& a, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& seg, Device dev) {
  Tensor out = Tensor::empty(q.shape(), DType::F32, dev);
  Tensor lse = Tensor::empty({q.size(0), q.size(1), a.t}, DType::F32, dev);
  {
    Dispatch kd("attention", &KernelTable::attention, {&q, &k, &v, &out, &lse, &seg});
    kd->forward(a, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                lse.data<float>());
  }
  if (!needs_grad({&q, &k, &v})) return joined(out, {&q, &k, &v});
  return record("attention", {q, k, v}, out,
                [a, qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach(), lse,
                 seg = seg.detach()](const std::vector<Tensor>& g) {
                  const Device dev = qd.device();
                  Tensor gq = Tensor::empty(qd.shape(), DType::F32, dev),
                         gk = Tensor::empty(kd.shape(), DType::F32, dev),
                         gv = Tensor::empty(vd.shape(), DType::F32, dev);
                  Dispatch k("attention_backward", &KernelTable::attention,
                             {&qd, &kd, &vd, &od, &lse, &g[0], &gq, &gk, &gv, &seg});
                  k->backward(a, qd.data<float>(), kd.data<float>(), vd.data<float>(),
                              od.data<float>(), lse.data<float>(), g[0].data<float>(),
                              gq.data<float>(), gk.data<float>(), gv.data<float>());
                  return std::vector<Tensor>{gq, gk, gv};
                });
}

// The plan of attention_packed: q, k, v read in place from the (B, T, H, 3, D) projection.
AttentionPlan packed_plan(const Shape& qkv, std::int64_t h, bool causal, float scale, bool bf16) {
  const std::int64_t b = qkv[0], t = qkv[1];
  const std::int64_t d = qkv[2] / (3 * h), c = h * d;
  AttentionPlan a;
  a.bh = b * h;
  a.t = a.s = t;
  a.d = d;
  a.ldq = a.ldkv = 3 * c;
  a.ldo = c;
  // Head j of batch i: q at row (i, 0) + j 3D, k and v D and 2 D further; o at j D.
  a.heads = h;
  a.q_b = a.kv_b = t * 3 * c;
  a.q_h = a.kv_h = 3 * d;
  a.o_b = t * c;
  a.o_h = d;
  a.causal = causal;
  a.scale = default_scale(scale, d);
  a.bf16_products = bf16;
  return a;
}

// attention_packed() through the f32 entries.
Tensor attention_packed_f32(const AttentionPlan& a, const Tensor& qkv, const Tensor& seg,
                            const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, DType::F32, qkv.device());
  Tensor lse = Tensor::empty({a.bh / a.heads, a.heads, a.t}, DType::F32, qkv.device());
  {
    Dispatch kd("attention_packed", &KernelTable::attention, {&qkv, &out, &lse, &seg});
    const float* pq = qkv.data<float>();
    kd->forward(a, pq, pq + a.d, pq + 2 * a.d, out.data<float>(), lse.data<float>());
  }
  if (!needs_grad({&qkv})) return joined(out, {&qkv});
  return record("attention_packed", {qkv}, out,
                [a, xd = qkv.detach(), od = out.detach(), lse,
                 seg = seg.detach()](const std::vector<Tensor>& g) {
                  Tensor gx = Tensor::empty(xd.shape(), DType::F32, xd.device());
                  Dispatch k("attention_packed_backward", &KernelTable::attention,
                             {&xd, &od, &lse, &g[0], &gx, &seg});
                  const float* px = xd.data<float>();
                  float* pgx = gx.data<float>();
                  k->backward(a, px, px + a.d, px + 2 * a.d, od.data<float>(), lse.data<float>(),
                              g[0].data<float>(), pgx, pgx + a.d, pgx + 2 * a.d);
                  return std::vector<Tensor>{gx};
                });
}

// The plan of attention_block: check_attention's, with the global positions.
AttentionPlan block_plan(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& q_pos, const Tensor& k_pos, bool causal, float scale) {
  AttentionPlan a = check_attention(q, k, v, causal, scale, DType::F32, Tensor());
  for (const auto& [pos, n, name] :
       {std::tuple{&q_pos, a.t, "q_pos"}, std::tuple{&k_pos, a.s, "k_pos"}}) {
    check_defined(*pos, op, name);
    DISTJAX_CHECK(pos->dtype() == DType::I32 && pos->rank() == 1 && pos->size(0) == n,
                  InvalidArgument, "[", op, "] expected ", name, " i32 (", n, "), got ",
                  dtype_name(pos->dtype()), " ", to_string(pos->shape()));
    if (!host_reachable(pos->device())) continue;
    HostAccess open(op, pos->device(), pos->data<std::int32_t>(),
                    static_cast<std::size_t>(n) * sizeof(std::int32_t));
    const std::int32_t* p = pos->data<std::int32_t>();
    for (std::int64_t i = 1; i < n; ++i)
      DISTJAX_CHECK(p[i - 1] < p[i], InvalidArgument, "[", op, "] ", name,
                    " must be strictly ascending, but entry ", i, " is ", p[i], " after ",
                    p[i - 1]);
  }
  a.q_pos = q_pos.data<std::int32_t>();
  a.k_pos = k_pos.data<std::int32_t>();
  return a;
}

void check_part(const AttentionPart& p, const Shape& out, const char* op, const char* name) {
  DISTJAX_CHECK(p.out.defined() && p.lse.defined() && p.out.dtype() == DType::F32 &&
                    p.lse.dtype() == DType::F32 && p.out.shape() == out &&
                    p.lse.shape() == Shape(out.begin(), out.end() - 1),
                InvalidArgument, "[", op, "] expected ", name, " of out f32 ", to_string(out),
                " and lse f32 (B, H, T), got out ",
                p.out.defined() ? to_string(p.out.shape()) : "undefined", ", lse ",
                p.lse.defined() ? to_string(p.lse.shape()) : "undefined");
}

}  // namespace

AttentionPart attention_block(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& q_pos, const Tensor& k_pos, bool causal, float scale) {
  const AttentionPlan a = block_plan("attention_block", q, k, v, q_pos, k_pos, causal, scale);
  const Device dev = detail::op_device("attention_block", {&q, &k, &v, &q_pos, &k_pos});
  AttentionPart part{Tensor::empty(q.shape(), DType::F32, dev),
                     Tensor::empty({q.size(0), q.size(1), a.t}, DType::F32, dev)};
  Dispatch kd("attention_block", &KernelTable::attention,
              {&q, &k, &v, &q_pos, &k_pos, &part.out, &part.lse});
  kd->forward(a, q.data<float>(), k.data<float>(), v.data<float>(), part.out.data<float>(),
              part.lse.data<float>());
  if (host_reachable(dev))  // the plan reads the positions (opened by the dispatch)
    for (std::int64_t r = 0; r < a.t; ++r)
      part.pairs += a.visible(r) * a.bh;
  return part;
}

void attention_merge(AttentionPart& acc, const AttentionPart& part) {
  check_part(acc, acc.out.defined() ? acc.out.shape() : Shape{}, "attention_merge", "acc");
  check_part(part, acc.out.shape(), "attention_merge", "part");
  Dispatch kd("attention_merge", &KernelTable::attention, {&acc.out, &acc.lse, &part.out, &part.lse});
  if (kd->merge == nullptr) detail::no_kernel("attention_merge", kd.device());
  const std::int64_t d = acc.out.size(acc.out.rank() - 1);
  kd->merge(acc.lse.numel(), d, acc.out.data<float>(), acc.lse.data<float>(),
            part.out.data<float>(), part.lse.data<float>());
  acc.pairs += part.pairs;
}

AttentionGrads attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& q_pos, const Tensor& k_pos,
                                        const AttentionPart& whole, const Tensor& g_out,
                                        bool causal, float scale) {
  const char* op = "attention_block_backward";
  const AttentionPlan a = block_plan(op, q, k, v, q_pos, k_pos, causal, scale);
  check_part(whole, q.shape(), op, "whole");
  detail::require_f32(op, {&g_out});
  DISTJAX_CHECK(g_out.shape() == q.shape(), InvalidArgument, "[", op, "] expected g_out ",
                to_string(q.shape()), ", got ", to_string(g_out.shape()));
  const Device dev = detail::op_device(op, {&q, &k, &v, &q_pos, &k_pos, &whole.out, &g_out});
  AttentionGrads g{Tensor::empty(q.shape(), DType::F32, dev),
                   Tensor::empty(k.shape(), DType::F32, dev),
                   Tensor::empty(v.shape(), DType::F32, dev)};
  Dispatch kd(op, &KernelTable::attention,
              {&q, &k, &v, &q_pos, &k_pos, &whole.out, &whole.lse, &g_out, &g.dq, &g.dk, &g.dv});
  kd->backward(a, q.data<float>(), k.data<float>(), v.data<float>(), whole.out.data<float>(),
               whole.lse.data<float>(), g_out.data<float>(), g.dq.data<float>(),
               g.dk.data<float>(), g.dv.data<float>());
  return g;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                 DType compute, DType out_dtype, const Tensor& segments) {
  const AttentionPlan a = check_attention(q, k, v, causal, scale, compute, segments);
  check_out(out_dtype, "attention");
  const Device dev = detail::op_device("attention", {&q, &k, &v, &segments});
  if (runs_bf16(a, dev)) return attention_bf16(a, q, k, v, segments, dev, out_dtype);
  return astype(attention_f32(a, q, k, v, segments, dev), out_dtype);
}

Tensor attention_packed(const Tensor& qkv, std::int64_t num_heads, bool causal, float scale,
                        DType compute, DType out_dtype, const Tensor& segments) {
  check_defined(qkv, "attention_packed", "qkv");
  const bool bf16 = bf16_products(compute, "attention_packed");
  DISTJAX_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == compute, InvalidArgument,
                "[attention_packed] reads qkv in f32 or in the compute dtype (",
                dtype_name(compute), "), not ", dtype_name(qkv.dtype()));
  check_out(out_dtype, "attention_packed");
  DISTJAX_CHECK(qkv.rank() == 3 && num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0,
                InvalidArgument,
                "[attention_packed] expected qkv (B, T, 3 H D) with H = ", num_heads,
                " heads, got ", to_string(qkv.shape()));
  AttentionPlan a = packed_plan(qkv.shape(), num_heads, causal, scale, bf16);
  set_segments(a, segments, qkv.size(0), num_heads, "attention_packed");
  const Shape out_shape{qkv.size(0), qkv.size(1), num_heads * a.d};
  detail::op_device("attention_packed", {&qkv, &segments});
  if (runs_bf16(a, qkv.device()))
    return attention_packed_bf16(a, qkv, segments, out_shape, out_dtype);
  // f32 kernels: a reduced-precision qkv widened (its cotangent rounded back by astype).
  return astype(attention_packed_f32(a, astype(qkv, DType::F32), segments, out_shape), out_dtype);
}

DType attention_packed_input_dtype(const Shape& qkv_shape, std::int64_t num_heads, bool causal,
                                   DType compute, Device device, bool segments) {
  if (!bf16_products(compute, "attention_packed")) return DType::F32;
  if (qkv_shape.size() != 3 || num_heads <= 0 || qkv_shape[2] % (3 * num_heads) != 0)
    return DType::F32;  // attention_packed itself names what is wrong
  AttentionPlan a = packed_plan(qkv_shape, num_heads, causal, 0.f, true);
  // Any non-null pointer stands for ids here: the entries only ask whether there are any.
  static const std::int32_t kAnyIds = 0;
  if (segments) a.segments = &kAnyIds;
  return runs_bf16(a, device) ? DType::BF16 : DType::F32;
}

}  // namespace distjax::tensor
