#include "distjax/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/spmd/ragged.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"
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

// Identity forward; the cotangent times `s` backward.
Tensor scale_cotangent(const Tensor& x, double s) {
  if (!tensor::needs_grad({&x})) return x;
  return tensor::record("scale_cotangent", {x}, x.detach(), [s](std::vector<Tensor>& g) {
    return std::vector<Tensor>{tensor::mul_scalar(g[0], s)};
  });
}

// The experts' MLPs over rows in the expert order: w1, wg (undefined without SwiGLU) and w2
// hold the experts of `offsets` (their groups of rows).
Tensor expert_mlps(const Precision& p, const Tensor& xp, const Tensor& w1, const Tensor& wg,
                   const Tensor& w2, const std::vector<std::int64_t>& offsets) {
  using namespace tensor;
  const Tensor x = p.cast_to_compute(xp);
  Tensor a = grouped_matmul(x, p.cast_to_compute(w1), offsets);  // (M, H)
  a = wg.defined() ? mul(silu(grouped_matmul(x, p.cast_to_compute(wg), offsets)), a)
                   : gelu(a, true);
  return grouped_matmul(p.cast_to_compute(a), p.cast_to_compute(w2), offsets);  // (M, C)
}

// Part c of `rows` rows split in `k` parts: rows [part_start, part_start + part_rows).
std::int64_t part_start(std::int64_t rows, std::int64_t k, std::int64_t c) { return rows * c / k; }
std::int64_t part_rows(std::int64_t rows, std::int64_t k, std::int64_t c) {
  return part_start(rows, k, c + 1) - part_start(rows, k, c);
}

// The plan of pairs already chosen here: pair p goes to local expert group[p] (-1: nowhere),
// each expert's pairs in their order; `shape` (N, k) of the pairs, on `device`.
tensor::DispatchPlan local_plan(const std::vector<std::int32_t>& group, std::int64_t experts,
                                const Shape& shape, const Device& device) {
  tensor::DispatchPlan plan;
  plan.counts.assign(static_cast<std::size_t>(experts), 0);
  for (std::int32_t g : group)
    if (g >= 0) ++plan.counts[static_cast<std::size_t>(g)];
  plan.routed = plan.counts;
  std::vector<std::int64_t> next = plan.offsets();
  std::vector<std::int32_t> position(group.size(), -1);
  for (std::size_t p = 0; p < group.size(); ++p)
    if (group[p] >= 0) position[p] = std::int32_t(next[static_cast<std::size_t>(group[p])]++);
  plan.position = Tensor::from_vector(position, shape, device);
  return plan;
}

// The rows `parts` (each a slice of a tensor of rows like `like`) concatenated; none: 0 rows.
Tensor concat_rows(const std::vector<Tensor>& parts, const Tensor& like) {
  return parts.empty() ? tensor::slice(like, 0, 0, 0) : tensor::concat(parts, 0);
}

}  // namespace

// The size of the expert axis this scope's experts are split over; 1 without one.
int expert_parallel_size(const Scope& scope) {
  const spmd::DeviceContext* ctx = scope.context();
  return ctx != nullptr && ctx->mesh().has_axis(kExpertAxis) ? ctx->axis_size(kExpertAxis) : 1;
}

void balance_bias_update(tensor::TensorTree& params,
                         const std::map<std::string, std::vector<double>>& loads, double rate) {
  for (const auto& [path, load] : loads) {
    const Tensor& bias = params.at(path);
    DISTJAX_CHECK(bias.numel() == std::int64_t(load.size()), InvalidArgument,
                  "[balance_bias_update] \"", path, "\" holds ", bias.numel(),
                  " values (a shard?) for ", load.size(), " experts");
    double mean = 0;
    for (double l : load) mean += l;
    mean /= double(std::max<std::size_t>(load.size(), 1));
    std::vector<float> step(load.size());
    for (std::size_t g = 0; g < load.size(); ++g)
      step[g] = float(load[g] < mean ? rate : load[g] > mean ? -rate : 0.0);
    tensor::add_into(bias, Tensor::from_vector(step, {std::int64_t(step.size())}, bias.device()));
  }
}

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
  DISTJAX_CHECK(exchange_chunks >= 1, InvalidArgument, "[MoE] exchange_chunks = ", exchange_chunks,
                " must be at least 1");
  DISTJAX_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0 && balance_bias_rate >= 0,
                InvalidArgument, "[MoE] aux_loss_coef = ", aux_loss_coef, ", z_loss_coef = ",
                z_loss_coef, " and balance_bias_rate = ", balance_bias_rate,
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
  return c * num_experts + (balance_bias_rate > 0 ? num_experts : 0) + num_experts * per_expert +
         shared;
}

std::int64_t MoE::active_params(std::int64_t c) const {
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  const std::int64_t shared = shared_experts > 0 ? 2 * c * shared_experts * h + shared_experts * h + c : 0;
  return c * num_experts + top_k * (swiglu ? 3 : 2) * c * h + shared;
}

Tensor MoE::exchange_and_run(const Scope& scope, const Tensor& xp, const tensor::DispatchPlan& plan,
                             const Tensor& w1, const Tensor& wg, const Tensor& w2,
                             const std::function<void()>& meanwhile) const {
  using namespace tensor;
  spmd::DeviceContext& ctx = *scope.context();
  const int n = ctx.axis_size(kExpertAxis), me = ctx.axis_index(kExpertAxis);
  const std::int64_t e = num_experts, el = e / n, chunks = exchange_chunks;
  // Counts first: every device's pairs per expert, (n, E) on every device.
  std::vector<std::int32_t> all;
  {
    NoGradGuard off;
    std::vector<std::int32_t> mine(plan.counts.begin(), plan.counts.end());
    all = spmd::all_gather(ctx, Tensor::from_vector(mine, {1, e}, xp.device()), kExpertAxis, 0,
                           /*tiled=*/true)
              .to_vector<std::int32_t>();
  }
  // pairs(i, j, le): device i's pairs for the le-th expert device j holds; rows(i, j) their
  // sum, the rows device i sends device j (in the expert order, a contiguous block of xp).
  auto pairs = [&](int i, int j, std::int64_t le) {
    return std::int64_t(all[static_cast<std::size_t>(i * e + j * el + le)]);
  };
  std::vector<std::int64_t> block_rows(static_cast<std::size_t>(n * n), 0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      for (std::int64_t le = 0; le < el; ++le)
        block_rows[static_cast<std::size_t>(i * n + j)] += pairs(i, j, le);
  auto rows = [&](int i, int j) { return block_rows[static_cast<std::size_t>(i * n + j)]; };
  std::vector<std::int64_t> offset(n + 1, 0);  // device j's block of xp
  for (int j = 0; j < n; ++j) offset[j + 1] = offset[j] + rows(me, j);

  // Chunk c carries part c of every (source, destination) block. Every exchange starts
  // before the first is waited on: chunk c + 1 travels while the experts run on chunk c.
  struct Chunk {
    std::vector<std::int64_t> send, recv;
    std::int64_t block = 0;
    spmd::RaggedHandle there, back;
  };
  std::vector<Chunk> ch(static_cast<std::size_t>(chunks));
  for (std::int64_t c = 0; c < chunks; ++c) {
    Chunk& k = ch[static_cast<std::size_t>(c)];
    k.send.assign(n, 0);
    k.recv.assign(n, 0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) k.block = std::max(k.block, part_rows(rows(i, j), chunks, c));
    std::vector<Tensor> out;
    for (int j = 0; j < n; ++j) {
      k.send[j] = part_rows(rows(me, j), chunks, c);
      k.recv[j] = part_rows(rows(j, me), chunks, c);
      const std::int64_t at = offset[j] + part_start(rows(me, j), chunks, c);
      if (k.send[j] > 0) out.push_back(slice(xp, 0, at, at + k.send[j]));
    }
    k.there = spmd::ragged_all_to_all_start(ctx, concat_rows(out, xp), kExpertAxis, k.send,
                                            k.recv, k.block);
  }
  meanwhile();  // while every chunk travels
  for (std::int64_t c = 0; c < chunks; ++c) {
    Chunk& k = ch[static_cast<std::size_t>(c)];
    const Tensor got = spmd::ragged_all_to_all_done(k.there);
    // The rows arrive by source device, each source's part of its block in the order of
    // the experts here: put them expert by expert (a permutation, k = 1), run the local
    // experts, and put them back.
    std::vector<std::int32_t> expert_of;  // local expert of each row received
    expert_of.reserve(static_cast<std::size_t>(got.size(0)));
    for (int i = 0; i < n; ++i) {
      const std::int64_t lo = part_start(rows(i, me), chunks, c), hi = lo + k.recv[i];
      std::int64_t at = 0;
      for (std::int64_t le = 0; le < el; ++le) {
        const std::int64_t end = at + pairs(i, me, le);
        for (std::int64_t r = std::max(at, lo); r < std::min(end, hi); ++r)
          expert_of.push_back(std::int32_t(le));
        at = end;
      }
    }
    const DispatchPlan by_expert = local_plan(expert_of, el, {got.size(0), 1}, xp.device());
    const Tensor yl = expert_mlps(scope.precision(), moe_dispatch(got, by_expert), w1, wg, w2,
                                  by_expert.offsets());
    k.back = spmd::ragged_all_to_all_start(ctx, moe_combine(yl, by_expert), kExpertAxis, k.recv,
                                           k.send, k.block);
  }
  // The outputs come back as they left: chunk c's part of each destination's block.
  std::vector<Tensor> returned;
  for (Chunk& k : ch) returned.push_back(spmd::ragged_all_to_all_done(k.back));
  std::vector<Tensor> yp;
  std::vector<std::int64_t> at(static_cast<std::size_t>(chunks), 0);  // each chunk's cursor
  for (int j = 0; j < n; ++j)
    for (std::size_t c = 0; c < ch.size(); ++c) {
      const std::int64_t r = ch[c].send[j];
      if (r > 0) yp.push_back(slice(returned[c], 0, at[c], at[c] + r));
      at[c] += r;
    }
  return concat_rows(yp, returned.front());
}

Tensor MoE::gather_and_run(const Scope& scope, const Tensor& x, const Tensor& chosen,
                           const Tensor& gates, const Tensor& w1, const Tensor& wg,
                           const Tensor& w2) const {
  using namespace tensor;
  spmd::DeviceContext& ctx = *scope.context();
  const int n = ctx.axis_size(kExpertAxis), me = ctx.axis_index(kExpertAxis);
  const std::int64_t e = num_experts, el = e / n, tokens = x.size(0), k = top_k;
  // Every device's tokens, gates and choices, (n N, ...) in device order.
  const Tensor xs = spmd::all_gather(ctx, x, kExpertAxis, 0, /*tiled=*/true);
  const Tensor gs = spmd::all_gather(ctx, gates, kExpertAxis, 0, /*tiled=*/true);
  Tensor cs;
  {
    NoGradGuard off;
    cs = spmd::all_gather(ctx, chosen, kExpertAxis, 0, /*tiled=*/true);
  }
  // The pairs this device's experts keep: each source's own plan (the one its all-to-all
  // dispatch makes, with the capacity of its N tokens), those of experts [me el, me el + el).
  const std::vector<std::int32_t> expert = cs.to_vector<std::int32_t>();
  std::vector<std::int32_t> local_expert(expert.size(), -1);
  for (int i = 0; i < n; ++i) {
    const Tensor ci = slice(cs, 0, i * tokens, (i + 1) * tokens);
    const DispatchPlan pi = dispatch_plan(
        ci, e, capacity(tokens),
        drop_by_probability ? slice(gs.detach(), 0, i * tokens, (i + 1) * tokens) : Tensor());
    const std::vector<std::int32_t> kept = pi.position.to_vector<std::int32_t>();
    for (std::size_t p = 0; p < kept.size(); ++p) {
      const std::size_t at = std::size_t(i * tokens * k) + p;
      if (kept[p] >= 0 && expert[at] / el == me) local_expert[at] = std::int32_t(expert[at] - me * el);
    }
  }
  // Their rows, expert by expert (each expert's in source, token and slot order).
  const DispatchPlan mine = local_plan(local_expert, el, {n * tokens, k}, x.device());
  const Tensor yl = expert_mlps(scope.precision(), moe_dispatch(xs, mine), w1, wg, w2,
                                mine.offsets());
  // This device's experts' gated share of every token's output, summed over the axis into
  // the tokens' own devices.
  return spmd::psum_scatter(ctx, moe_combine(yl, mine, gs), kExpertAxis, 0, /*tiled=*/true);
}

Tensor MoE::operator()(const Scope& scope, const Tensor& x_in) const {
  using namespace tensor;
  check_defined(x_in, "MoE", "x");
  DISTJAX_CHECK(x_in.rank() >= 1, InvalidArgument, "[MoE] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x_in.shape()));
  const std::int64_t c = x_in.size(-1), e = num_experts, k = top_k;
  check(c);
  const std::int64_t h = hidden > 0 ? hidden : 4 * c;
  spmd::DeviceContext* ctx = scope.context();
  const int n_tp = !tensor_axis.empty() && ctx != nullptr && ctx->mesh().has_axis(tensor_axis)
                       ? ctx->axis_size(tensor_axis)
                       : 1;
  // Each expert's hidden width split over the tensor axis while the tokens are split over
  // it too (sequence parallelism): the slices need every token of the axis, so they are
  // gathered first, along the dimension before the features (the sequence's), and the
  // summed outputs are scattered back (Megatron's pair); every device of the axis then
  // routes the same tokens.
  const bool gathered = n_tp > 1 && sequence_axis == tensor_axis;
  const int seq_dim = x_in.rank() - 2;
  DISTJAX_CHECK(!gathered || seq_dim >= 0, InvalidArgument, "[MoE] \"", scope.path(),
                "\": tokens split over \"", sequence_axis,
                "\" need x of rank >= 2 (..., T, C), got ", to_string(x_in.shape()));
  const Tensor x_tokens =
      gathered ? spmd::all_gather(*ctx, x_in, tensor_axis, seq_dim, /*tiled=*/true) : x_in;
  // Routing in f32 whatever the compute dtype (the router's softmax and top-k decide which
  // expert sees a token: no bf16 rounding there).
  const Tensor x =
      reshape(x_tokens.dtype() == DType::F32 ? x_tokens : astype(x_tokens, DType::F32), {-1, c});
  const std::int64_t n = x.size(0);
  const Tensor wr = scope.child("router").param("kernel", {c, e}, expert_init(c, 1.0));
  const Tensor logits = matmul(x, wr);  // (N, E)
  const Tensor probs = softmax(logits);
  // The selection is not differentiated: the gradient reaches the router through the gates.
  // With the balancing bias, the selection sees probs + bias; the gates stay the probs.
  const Tensor bias = balance_bias_rate > 0
                          ? scope.child("router").param("bias", {e}, zeros())
                          : Tensor();
  Tensor chosen;
  {
    NoGradGuard off;
    chosen = top_k_indices(bias.defined() ? add(probs.detach(), bias.detach()) : probs.detach(), k);
  }
  Tensor gates = take_along_last(probs, chosen);  // (N, k)
  if (renormalize) gates = div(gates, sum(gates, {1}, /*keepdims=*/true));
  const DispatchPlan plan =
      dispatch_plan(chosen, e, capacity(n), drop_by_probability ? gates.detach() : Tensor());

  // The experts: stacked, split over the expert axis (each device holds E / n of them),
  // each one's hidden width split over the tensor axis; one grouped product per projection
  // over the expert order.
  const int n_ep = expert_parallel_size(scope);
  DISTJAX_CHECK(e % n_ep == 0, ShardingError, "[MoE] \"", scope.path(), "\": ", e,
                " experts do not split over the \"", kExpertAxis, "\" axis of ", n_ep);
  DISTJAX_CHECK(h % n_tp == 0, ShardingError, "[MoE] \"", scope.path(), "\": the experts' hidden ",
                "width ", h, " does not split over the \"", tensor_axis, "\" axis of ", n_tp);
  DISTJAX_CHECK(shared_experts * h % n_tp == 0, ShardingError, "[MoE] \"", scope.path(),
                "\": the shared expert's hidden width ", shared_experts * h,
                " does not split over the \"", tensor_axis, "\" axis of ", n_tp);
  const mesh::PartitionSpec::Entry by_expert =
      n_ep > 1 ? mesh::PartitionSpec::Entry(kExpertAxis) : mesh::PartitionSpec::Entry(std::nullopt);
  const mesh::PartitionSpec::Entry by_tensor = n_tp > 1 ? mesh::PartitionSpec::Entry(tensor_axis)
                                                        : mesh::PartitionSpec::Entry(std::nullopt);
  const mesh::PartitionSpec whole = n_ep > 1 ? mesh::P(kExpertAxis) : mesh::PartitionSpec();
  const mesh::PartitionSpec columns =  // (E, C, H)
      n_tp > 1 ? mesh::PartitionSpec(by_expert, std::nullopt, by_tensor) : whole;
  const mesh::PartitionSpec rows =  // (E, H, C)
      n_tp > 1 ? mesh::PartitionSpec(by_expert, by_tensor, std::nullopt) : whole;
  const Scope ex = scope.child("experts");
  Tensor w1 = ex.param("fc1", {e, c, h}, expert_init(c, 1.0), columns);
  Tensor wg = swiglu ? ex.param("gate", {e, c, h}, expert_init(c, 1.0), columns) : Tensor();
  Tensor w2 = ex.param("fc2", {e, h, c}, expert_init(h, out_scale), rows);
  if (n_ep > 1) {
    // The devices of the axis see different tokens, and the averaged gradients of the
    // replicated parameters are the mean over all of them; an expert's gradient arrives
    // summed over the axis's tokens (the exchange's transpose): scaled so it is that mean.
    w1 = scale_cotangent(w1, 1.0 / n_ep);
    w2 = scale_cotangent(w2, 1.0 / n_ep);
    if (wg.defined()) wg = scale_cotangent(wg, 1.0 / n_ep);
  }
  // With the experts' hidden width split, each device of the tensor axis takes the input's
  // gradient of its slice: summed over the axis here, on the N tokens (Megatron's f), not
  // later on the k N rows. (Gathered tokens vary over the axis already: their gradient is
  // summed by the gather's transpose.)
  const Tensor xe = n_tp > 1 ? spmd::pvary(*ctx, x, tensor_axis) : x;
  // The shared expert, a dense MLP of every token: independent of the routing, so with the
  // all-to-all exchange it runs while the tokens travel (forward, and in the backward pass
  // between the transposed exchanges' starts and their waits). With the experts split over
  // the tensor axis it is split as Megatron splits a dense MLP (fc1 by columns, fc2 by
  // rows), its partial output joining the experts' before their sum over the axis and
  // fc2's bias added after it; else it runs whole and is added last, after the experts'
  // output, in the same order whichever dispatcher or chunks made that.
  Tensor shared, shared_bias;
  const auto run_shared = [&] {
    if (shared_experts == 0) return;
    const MLPBlock whole_mlp{.hidden = shared_experts * h,
                             .kernel_init = lecun_normal(),
                             .out_init = scaled(lecun_normal(), out_scale)};
    if (n_tp == 1) {
      shared = whole_mlp(scope.child("shared"), x);
      return;
    }
    const Scope s = scope.child("shared");
    const Dense fc1{.features = whole_mlp.hidden,
                    .kernel_init = whole_mlp.kernel_init,
                    .kernel_spec = mesh::PartitionSpec(std::nullopt, by_tensor),
                    .bias_spec = mesh::PartitionSpec(by_tensor)};
    const Dense fc2{.features = c,
                    .kernel_init = whole_mlp.out_init,
                    .kernel_spec = mesh::PartitionSpec(by_tensor, std::nullopt)};
    const auto [ws1, bs1] = fc1.params(s.child("fc1"), c);
    const auto [ws2, bs2] = fc2.params(s.child("fc2"), whole_mlp.hidden / n_tp);
    const Precision& p = scope.precision();
    auto compute = [&p](const Tensor& t) { return p.mixed() ? p.cast_to_compute(t) : t; };
    shared = gelu_mlp(compute(xe), compute(ws1), bs1, compute(ws2), Tensor());
    shared_bias = bs2;
  };
  Tensor y;  // (N, C)
  if (n_ep > 1 && dispatcher == Dispatcher::AllGather) {
    y = gather_and_run(scope, xe, chosen, gates, w1, wg, w2);
  } else {
    const Tensor xp = moe_dispatch(xe, plan);  // (M, C) in the expert order
    const Tensor yp = n_ep == 1 ? expert_mlps(scope.precision(), xp, w1, wg, w2, plan.offsets())
                                : exchange_and_run(scope, xp, plan, w1, wg, w2, run_shared);
    y = moe_combine(yp, plan, gates);
  }
  if (shared_experts > 0 && !shared.defined()) run_shared();
  if (n_tp > 1) {
    // Each device of the tensor axis ran its slice of the experts' hidden width (and of the
    // shared expert's): partial sums, summed over the axis (scattered back to each device's
    // tokens when they were gathered).
    if (shared.defined()) y = add(y, shared);
    y = gathered ? spmd::psum_scatter(*ctx, reshape(y, x_tokens.shape()), tensor_axis, seq_dim,
                                      /*tiled=*/true)
                 : spmd::psum(*ctx, y, tensor_axis);
    if (shared_bias.defined()) y = add(y, shared_bias);
  } else if (shared.defined()) {
    y = add(y, shared);
  }

  const bool losses = (aux_loss_coef > 0 || z_loss_coef > 0) && tensor::grad_enabled();
  if (scope.sowing() || losses) {
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
    // The weighted losses join the objective through the backward pass (autodiff::add_loss:
    // also inside a rematerialised block and in a pipeline stage).
    if (losses) {
      Tensor weighted;
      if (aux_loss_coef > 0) weighted = mul_scalar(aux, aux_loss_coef);
      if (z_loss_coef > 0) {
        const Tensor wz = mul_scalar(z, z_loss_coef);
        weighted = weighted.defined() ? add(weighted, wz) : wz;
      }
      if (!sequence_axis.empty() && ctx != nullptr && ctx->mesh().has_axis(sequence_axis))
        weighted = mul_scalar(weighted, 1.0 / double(ctx->axis_size(sequence_axis)));
      y = autodiff::add_loss(y, weighted);
    }
    if (!scope.sowing()) return reshape(y, x_in.shape());
    scope.sow_metric("aux_loss", aux.detach());
    scope.sow_metric("z_loss", z.detach());
    const std::int64_t busiest = *std::max_element(plan.routed.begin(), plan.routed.end());
    const double mean_load = double(n * k) / double(e);
    scope.sow_metric("expert_load_max_over_mean",
                     Tensor::scalar(mean_load > 0 ? double(busiest) / mean_load : 1.0));
    scope.sow_metric("dropped_fraction",
                     Tensor::scalar(n * k > 0 ? double(plan.dropped()) / double(n * k) : 0.0));
    if (bias.defined())
      scope.sow_loads(scope.child("router").full_path("bias"),
                      std::vector<double>(plan.routed.begin(), plan.routed.end()));
  }
  return reshape(y, x_in.shape());
}

}  // namespace distjax::nn
