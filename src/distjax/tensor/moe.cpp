// Mixture-of-Experts ops: they check shapes, allocate on their inputs' device and dispatch
// the moe family (tensor/cpu/moe.cpp, tensor/cuda/moe.cu). Each op's backward follows it.
#include "distjax/tensor/moe.hpp"

#include <algorithm>
#include <numeric>

#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::Dispatch;
using detail::KernelTable;

void check_rank(const char* op, const char* what, const Tensor& t, int rank) {
  check_defined(t, op, what);
  DISTJAX_CHECK(t.rank() == rank, InvalidArgument, "[", op, "] ", what, " must have rank ", rank,
                ", got ", to_string(t.shape()));
}

void check_i32(const char* op, const char* what, const Tensor& t) {
  DISTJAX_CHECK(t.dtype() == DType::I32, InvalidArgument, "[", op, "] ", what, " must be i32, got ",
                dtype_name(t.dtype()));
}

void check_plan(const char* op, const DispatchPlan& plan) {
  DISTJAX_CHECK(plan.position.defined() && plan.position.rank() == 2 &&
                    plan.position.dtype() == DType::I32,
                InvalidArgument, "[", op, "] needs a plan made by dispatch_plan");
}

// The cotangent of a grouped product's operands in their dtype (f32 or bf16).
Tensor in_dtype(const Tensor& g, DType dtype) {
  if (g.dtype() == dtype) return g;
  Tensor out = Tensor::empty(g.shape(), dtype, g.device());
  detail::convert(g, out);
  return out;
}

}  // namespace

// ------------------------------------------------------------------ routing

Tensor top_k_indices(const Tensor& scores, std::int64_t k) {
  check_rank("top_k_indices", "scores", scores, 2);
  detail::require_f32("top_k_indices", {&scores});
  const std::int64_t n = scores.size(0), e = scores.size(1);
  DISTJAX_CHECK(k >= 1 && k <= e && k <= kMaxTopK, InvalidArgument, "[top_k_indices] k = ", k,
                " must be in [1, ", std::min(e, kMaxTopK), "] for ", e, " columns");
  Tensor out = Tensor::empty({n, k}, DType::I32, scores.device());
  Dispatch kd("top_k_indices", &KernelTable::moe, {&scores, &out});
  kd->top_k(scores.data<float>(), n, e, k, out.data<std::int32_t>());
  return joined(out, {&scores});
}

Tensor take_along_last(const Tensor& x, const Tensor& indices) {
  check_rank("take_along_last", "x", x, 2);
  check_rank("take_along_last", "indices", indices, 2);
  detail::require_f32("take_along_last", {&x});
  check_i32("take_along_last", "indices", indices);
  DISTJAX_CHECK(indices.size(0) == x.size(0), InvalidArgument, "[take_along_last] indices ",
                to_string(indices.shape()), " do not match x ", to_string(x.shape()));
  const std::int64_t n = x.size(0), e = x.size(1), k = indices.size(1);
  Tensor out = Tensor::empty({n, k}, DType::F32, detail::op_device("take_along_last", {&x, &indices}));
  {
    Dispatch kd("take_along_last", &KernelTable::moe, {&x, &indices, &out});
    kd->take_columns(x.data<float>(), indices.data<std::int32_t>(), n, e, k, out.data<float>());
  }
  if (!needs_grad({&x})) return joined(out, {&x, &indices});
  return record("take_along_last", {x}, out, [idx = indices.detach(), n, e, k](std::vector<Tensor>& g) {
    Tensor gx = Tensor::empty({n, e}, DType::F32, g[0].device());
    Dispatch kd("take_along_last", &KernelTable::moe, {&g[0], &idx, &gx});
    kd->take_columns_backward(g[0].data<float>(), idx.data<std::int32_t>(), n, e, k,
                              gx.data<float>());
    return std::vector<Tensor>{gx};
  });
}

// ------------------------------------------------------------------ the plan

std::int64_t DispatchPlan::rows() const {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

std::vector<std::int64_t> DispatchPlan::offsets() const {
  std::vector<std::int64_t> out(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), out.begin() + 1);
  return out;
}

DispatchPlan dispatch_plan(const Tensor& experts, std::int64_t num_experts, std::int64_t capacity,
                           const Tensor& priority) {
  const char* op = "dispatch_plan";
  check_rank(op, "experts", experts, 2);
  check_i32(op, "experts", experts);
  DISTJAX_CHECK(num_experts >= 1, InvalidArgument, "[dispatch_plan] needs at least one expert, got ",
                num_experts);
  if (priority.defined()) {
    detail::require_f32(op, {&priority});
    DISTJAX_CHECK(priority.shape() == experts.shape(), InvalidArgument, "[dispatch_plan] priority ",
                  to_string(priority.shape()), " does not match experts ",
                  to_string(experts.shape()));
  }
  const std::int64_t n = experts.size(0), k = experts.size(1);
  // The experts' range is checked on the host copy the counts need anyway... after the
  // kernel would be too late (it indexes by them): read them first.
  const std::vector<std::int32_t> chosen = experts.to_vector<std::int32_t>();
  std::vector<std::int64_t> routed(static_cast<std::size_t>(num_experts), 0);
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    DISTJAX_CHECK(chosen[i] >= 0 && chosen[i] < num_experts, InvalidArgument,
                  "[dispatch_plan] pair ", i, " (token ", std::int64_t(i) / k, ", slot ",
                  std::int64_t(i) % k, ") names expert ", chosen[i], " of ", num_experts);
    ++routed[static_cast<std::size_t>(chosen[i])];
  }
  DispatchPlan plan;
  const Device device = detail::op_device(op, {&experts, &priority});
  plan.position = Tensor::empty({n, k}, DType::I32, device);
  Tensor counts = Tensor::empty({num_experts}, DType::I32, device);
  {
    Dispatch kd(op, &KernelTable::moe, {&experts, &priority, &plan.position, &counts});
    kd->dispatch_plan(experts.data<std::int32_t>(),
                      priority.defined() ? priority.data<float>() : nullptr, n, k, num_experts,
                      capacity, plan.position.data<std::int32_t>(), counts.data<std::int32_t>());
  }
  for (std::int32_t c : counts.to_vector<std::int32_t>()) plan.counts.push_back(c);
  plan.routed = std::move(routed);
  return plan;
}

// ------------------------------------------------------------------ dispatch and combine

namespace {

// dst (rows, d) = for each kept pair, gates * g[token] (gates undefined: 1).
Tensor scatter_pairs(const char* op, const Tensor& g, const DispatchPlan& plan, const Tensor& gates,
                     const Tensor& src, Tensor* dgates) {
  const std::int64_t n = plan.tokens(), k = plan.top_k(), d = g.size(1);
  Tensor dst = Tensor::empty({plan.rows(), d}, DType::F32, g.device());
  if (dgates) *dgates = Tensor::empty({n, k}, DType::F32, g.device());
  Dispatch kd(op, &KernelTable::moe,
              {&g, &src, &plan.position, &gates, &dst, dgates ? dgates : &src});
  kd->combine_backward(g.data<float>(), src.defined() ? src.data<float>() : nullptr,
                       plan.position.data<std::int32_t>(),
                       gates.defined() ? gates.data<float>() : nullptr, n, k, d, dst.data<float>(),
                       dgates ? dgates->data<float>() : nullptr);
  return dst;
}

// y (n, d) = for each token, the sum over its kept slots of gates * src[position].
Tensor gather_pairs(const char* op, const Tensor& src, const DispatchPlan& plan, const Tensor& gates) {
  const std::int64_t n = plan.tokens(), k = plan.top_k(), d = src.size(1);
  Tensor y = Tensor::empty({n, d}, DType::F32, src.device());
  Dispatch kd(op, &KernelTable::moe, {&src, &plan.position, &gates, &y});
  kd->combine(src.data<float>(), plan.position.data<std::int32_t>(),
              gates.defined() ? gates.data<float>() : nullptr, n, k, d, y.data<float>());
  return y;
}

}  // namespace

Tensor moe_dispatch(const Tensor& x, const DispatchPlan& plan) {
  const char* op = "moe_dispatch";
  check_plan(op, plan);
  check_rank(op, "x", x, 2);
  detail::require_f32(op, {&x});
  DISTJAX_CHECK(x.size(0) == plan.tokens(), InvalidArgument, "[moe_dispatch] x ",
                to_string(x.shape()), " has not the plan's ", plan.tokens(), " tokens");
  detail::op_device(op, {&x, &plan.position});
  Tensor out = scatter_pairs(op, x, plan, Tensor(), Tensor(), nullptr);
  if (!needs_grad({&x})) return joined(out, {&x});
  return record(op, {x}, out, [plan](std::vector<Tensor>& g) {
    return std::vector<Tensor>{gather_pairs("moe_dispatch", g[0], plan, Tensor())};
  });
}

Tensor moe_combine(const Tensor& y, const DispatchPlan& plan, const Tensor& gates) {
  const char* op = "moe_combine";
  check_plan(op, plan);
  check_rank(op, "y", y, 2);
  detail::require_f32(op, {&y});
  DISTJAX_CHECK(y.size(0) == plan.rows(), InvalidArgument, "[moe_combine] y ",
                to_string(y.shape()), " has not the plan's ", plan.rows(), " rows");
  if (gates.defined()) {
    detail::require_f32(op, {&gates});
    DISTJAX_CHECK(gates.shape() == plan.position.shape(), InvalidArgument, "[moe_combine] gates ",
                  to_string(gates.shape()), " do not match the plan's (",
                  plan.tokens(), ", ", plan.top_k(), ")");
  }
  detail::op_device(op, {&y, &plan.position, &gates});
  Tensor out = gather_pairs(op, y, plan, gates);
  std::vector<Tensor> inputs{y};
  if (gates.defined()) inputs.push_back(gates);
  if (!needs_grad(inputs)) return joined(out, inputs);
  return record(op, inputs, out,
                [plan, yd = y.detach(), gd = gates.detach(), has_gates = gates.defined(),
                 want_gates = gates.defined() && gates.requires_grad()](std::vector<Tensor>& g) {
                  Tensor dgates;
                  Tensor dy = scatter_pairs("moe_combine", g[0], plan, gd, yd,
                                            want_gates ? &dgates : nullptr);
                  std::vector<Tensor> out{dy};
                  if (has_gates) out.push_back(dgates);
                  return out;
                });
}

// ------------------------------------------------------------------ grouped products

namespace {

// C (rows, n) = per group, rows of a times b[g] (op(b[g]) is kdim x n).
Tensor grouped_forward(const Tensor& a, const Tensor& b, const std::vector<std::int64_t>& offsets,
                       bool tb) {
  const std::int64_t groups = b.size(0), kdim = a.size(1), n = tb ? b.size(1) : b.size(2);
  Tensor c = Tensor::empty({a.size(0), n}, DType::F32, a.device());
  const detail::GroupedGemmKey key{groups, a.size(0), n, kdim, tb, a.dtype()};
  Dispatch kd("grouped_matmul", &KernelTable::moe, {&a, &b, &c});
  kd->grouped_gemm(key, offsets.data(), a.raw_data(), b.raw_data(), c.data<float>());
  return c;
}

// C (groups, kdim, n) = per group, a_g^T b_g.
Tensor grouped_wgrad(const Tensor& a, const Tensor& b, const std::vector<std::int64_t>& offsets,
                     std::int64_t groups) {
  const std::int64_t kdim = a.size(1), n = b.size(1);
  Tensor c = Tensor::empty({groups, kdim, n}, DType::F32, a.device());
  const detail::GroupedGemmKey key{groups, a.size(0), n, kdim, false, a.dtype()};
  Dispatch kd("grouped_matmul", &KernelTable::moe, {&a, &b, &c});
  kd->grouped_gemm_wgrad(key, offsets.data(), a.raw_data(), b.raw_data(), c.data<float>());
  return c;
}

}  // namespace

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<std::int64_t>& offsets,
                      bool trans_w) {
  const char* op = "grouped_matmul";
  check_rank(op, "x", x, 2);
  check_rank(op, "w", w, 3);
  DISTJAX_CHECK(x.dtype() == w.dtype() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
                InvalidArgument, "[grouped_matmul] x and w must be both f32 or both bf16, got ",
                dtype_name(x.dtype()), " and ", dtype_name(w.dtype()));
  const std::int64_t groups = w.size(0), kdim = trans_w ? w.size(2) : w.size(1);
  DISTJAX_CHECK(x.size(1) == kdim, InvalidArgument, "[grouped_matmul] x ", to_string(x.shape()),
                " does not match w ", to_string(w.shape()), trans_w ? " (E, N, K)" : " (E, K, N)");
  DISTJAX_CHECK(std::int64_t(offsets.size()) == groups + 1 && offsets.front() == 0 &&
                    offsets.back() == x.size(0) &&
                    std::is_sorted(offsets.begin(), offsets.end()),
                InvalidArgument, "[grouped_matmul] needs ", groups + 1,
                " ascending offsets from 0 to ", x.size(0), " (x's rows), got ", offsets.size(),
                " values");
  detail::op_device(op, {&x, &w});
  Tensor out = grouped_forward(x, w, offsets, trans_w);
  if (!needs_grad({&x, &w})) return joined(out, {&x, &w});
  return record(op, {x, w}, out,
                [xd = x.detach(), wd = w.detach(), offsets, trans_w, groups,
                 rx = x.requires_grad(), rw = w.requires_grad()](std::vector<Tensor>& g) {
                  const Tensor gc = in_dtype(g[0], xd.dtype());
                  Tensor gx, gw;
                  // C = X op(W_g): dX = dC op(W_g)^T; dW_g = X_g^T dC_g, or its transpose.
                  if (rx) gx = grouped_forward(gc, wd, offsets, !trans_w);
                  if (rw) gw = trans_w ? grouped_wgrad(gc, xd, offsets, groups)
                                       : grouped_wgrad(xd, gc, offsets, groups);
                  return std::vector<Tensor>{gx, gw};
                });
}

}  // namespace distjax::tensor
