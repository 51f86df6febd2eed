#include "distjax/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "distjax/core/error.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/moe.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {

namespace {

// lecun_normal's spread for a fan-in of `fan` (the stacked experts' fan-in is one
// expert's, not E times it): a normal truncated to +-2 std, rescaled to variance 1 / fan.
Initializer expert_init(std::int64_t fan, double scale) {
  return truncated_normal(scale * std::sqrt(1.0 / double(fan)) / 0.87962566103423978);
}

}  // namespace

void MoE::check(std::int64_t c) const {
  DISTJAX_CHECK(num_experts >= 1, InvalidArgument, "[MoE] num_experts = ", num_experts,
                " must be at least 1");
  DISTJAX_CHECK(top_k >= 1 && top_k <= std::min(num_experts, tensor::kMaxTopK), InvalidArgument,
                "[MoE] top_k = ", top_k, " must be in [1, ", std::min(num_experts, tensor::kMaxTopK),
                "] for ", num_experts, " experts");
  DISTJAX_CHECK(capacity_factor < 0 || capacity_factor > 0, InvalidArgument,
                "[MoE] capacity_factor = 0 would drop every token (< 0: dropless)");
  DISTJAX_CHECK(hidden >= 0 && shared_experts >= 0 && c >= 1, InvalidArgument,
                "[MoE] hidden = ", hidden, ", shared_experts = ", shared_experts, " and width ", c,
                " must not be negative");
  DISTJAX_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0, InvalidArgument,
                "[MoE] aux_loss_coef = ", aux_loss_coef, " and z_loss_coef = ", z_loss_coef,
                " must not be negative");
}

std::int64_t MoE::capacity(std::int64_t tokens) const {
  if (capacity_factor < 0) return -1;
  return static_cast<std::int64_t>(
      std::ceil(capacity_factor * double(tokens * top_k) / double(num_experts)));
}

std::int64_t MoE::num_params(std::int64_t c) const {
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  const std::int64_t per_expert = (swiglu ? 3 : 2) * c * h;
  const std::int64_t shared = shared_experts > 0 ? 2 * c * shared_experts * h + shared_experts * h + c : 0;
  return c * num_experts + num_experts * per_expert + shared;
}

std::int64_t MoE::active_params(std::int64_t c) const {
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  const std::int64_t shared = shared_experts > 0 ? 2 * c * shared_experts * h + shared_experts * h + c : 0;
  return c * num_experts + top_k * (swiglu ? 3 : 2) * c * h + shared;
}

Tensor MoE::operator()(const Scope& scope, const Tensor& x_in) const {
  using namespace tensor;
  check_defined(x_in, "MoE", "x");
  DISTJAX_CHECK(x_in.rank() >= 1, InvalidArgument, "[MoE] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x_in.shape()));
  const std::int64_t c = x_in.size(-1), e = num_experts, k = top_k;
  check(c);
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  // Routing in f32 whatever the compute dtype (the router's softmax and top-k decide which
  // expert sees a token: no bf16 rounding there).
  const Tensor x = reshape(x_in.dtype() == DType::F32 ? x_in : astype(x_in, DType::F32), {-1, c});
  const std::int64_t n = x.size(0);
  const Tensor wr = scope.child("router").param("kernel", {c, e}, expert_init(c, 1.0));
  const Tensor logits = matmul(x, wr);  // (N, E)
  const Tensor probs = softmax(logits);
  // The selection is not differentiated: the gradient reaches the router through the gates.
  Tensor chosen;
  {
    NoGradGuard off;
    chosen = top_k_indices(probs.detach(), k);
  }
  Tensor gates = take_along_last(probs, chosen);  // (N, k)
  if (renormalize) gates = div(gates, sum(gates, {1}, /*keepdims=*/true));
  const DispatchPlan plan =
      dispatch_plan(chosen, e, capacity(n), drop_by_probability ? gates.detach() : Tensor());

  // The experts: one grouped product per projection over the expert order.
  const Scope ex = scope.child("experts");
  const Precision& p = scope.precision();
  const Tensor w1 = ex.param("fc1", {e, c, h}, expert_init(c, 1.0));
  const Tensor wg = swiglu ? ex.param("gate", {e, c, h}, expert_init(c, 1.0)) : Tensor();
  const Tensor w2 = ex.param("fc2", {e, h, c}, expert_init(h, out_scale));
  const std::vector<std::int64_t> offsets = plan.offsets();
  const Tensor xp = p.cast_to_compute(moe_dispatch(x, plan));  // (M, C)
  Tensor a = grouped_matmul(xp, p.cast_to_compute(w1), offsets);  // (M, H)
  a = swiglu ? mul(silu(grouped_matmul(xp, p.cast_to_compute(wg), offsets)), a) : gelu(a, true);
  const Tensor yp = grouped_matmul(p.cast_to_compute(a), p.cast_to_compute(w2), offsets);  // (M, C)
  Tensor y = moe_combine(yp, plan, gates);  // (N, C)
  if (shared_experts > 0)
    y = MLPBlock{.hidden = shared_experts * h,
                 .kernel_init = lecun_normal(),
                 .out_init = scaled(lecun_normal(), out_scale)}(scope.child("shared"), x, y);

  if (scope.sowing()) {
    // Switch/GShard balance: E sum_e f_e P_e, f_e (host counts, constant) the fraction of
    // the pairs routed to e, P_e the mean probability of e (differentiated).
    std::vector<float> f(static_cast<std::size_t>(e));
    for (std::int64_t g = 0; g < e; ++g)
      f[static_cast<std::size_t>(g)] =
          float(double(plan.routed[static_cast<std::size_t>(g)]) / double(std::max<std::int64_t>(n * k, 1)));
    const Tensor fe = Tensor::from_vector(f, {e}, probs.device());
    const Tensor aux = mul_scalar(sum(mul(mean(probs, {0}), fe)), double(e));
    // z-loss: logsumexp of each token's logits, squared, averaged. lse = logit - log p.
    const Tensor lse = sub(slice(logits, 1, 0, 1), slice(log_softmax(logits), 1, 0, 1));
    const Tensor z = mean(square(lse));
    if (aux_loss_coef > 0) scope.sow_loss(mul_scalar(aux, aux_loss_coef));
    if (z_loss_coef > 0) scope.sow_loss(mul_scalar(z, z_loss_coef));
    scope.sow_metric("aux_loss", aux.detach());
    scope.sow_metric("z_loss", z.detach());
    const auto [lo, hi] = std::minmax_element(plan.routed.begin(), plan.routed.end());
    (void)lo;
    const double mean_load = double(n * k) / double(e);
    scope.sow_metric("expert_load_max_over_mean",
                     Tensor::scalar(mean_load > 0 ? double(*hi) / mean_load : 1.0));
    scope.sow_metric("dropped_fraction",
                     Tensor::scalar(n * k > 0 ? double(plan.dropped()) / double(n * k) : 0.0));
  }
  return reshape(y, x_in.shape());
}

}  // namespace distjax::nn
