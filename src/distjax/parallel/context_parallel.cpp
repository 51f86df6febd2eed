// Ring attention and Ulysses over a context axis (see parallel/context_parallel.hpp).
//
// Ring: device d, at step s of n, holds the key/value block of device (d - s) mod n. The
// forward runs without the tape (the transfers are plain ppermutes) and records one node,
// whose backward runs the ring again: it keeps the merged output and log-sum-exp, so each
// block's share of the gradients comes from attention_block_backward alone, and the key and
// value gradients of a block travel with it, arriving at their owner after the n-th hop.
#include "distjax/parallel/context_parallel.hpp"

#include <algorithm>
#include <utility>

#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

namespace {

int mod(int i, int n) {
  return ((i % n) + n) % n;
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  for (const auto& [x, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
    tensor::check_defined(*x, op, name);
  DISTJAX_CHECK(q.rank() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), InvalidArgument,
                "[", op, "] expected q, k and v of one shape (B, H, T/n, D), got q ",
                to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()));
}

// The positions of device `rank`'s tokens as an i32 tensor on the current device.
Tensor position_tensor(const ContextLayout& layout, int rank, std::int64_t t) {
  const std::vector<std::int32_t> p = layout.positions(rank, t);
  return Tensor::from_vector(p, {static_cast<std::int64_t>(p.size())});
}

void check_layout(const ContextLayout& layout, int n, const char* op) {
  DISTJAX_CHECK(layout.size == n, InvalidArgument, "[", op, "] the layout is for ", layout.size,
                " devices, the axis has ", n);
}

}  // namespace

// ------------------------------------------------------------------------ layout

std::vector<int> ContextLayout::chunks_of(int rank) const {
  DISTJAX_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                "[context layout] device ", rank, " of ", size);
  if (!balanced) return {rank};
  return {rank, 2 * size - 1 - rank};
}

std::vector<std::int32_t> ContextLayout::positions(int rank, std::int64_t t) const {
  DISTJAX_CHECK(divides(t), InvalidArgument, "[context layout] a sequence of ", t,
                " positions does not split into ", describe());
  const std::int64_t c = t / chunks();
  std::vector<std::int32_t> out;
  for (int chunk : chunks_of(rank))
    for (std::int64_t i = 0; i < c; ++i)
      out.push_back(static_cast<std::int32_t>(chunk * c + i));
  return out;
}

Tensor ContextLayout::shard(const Tensor& x, int dim, int rank) const {
  const std::int64_t t = x.size(dim);
  DISTJAX_CHECK(divides(t), InvalidArgument, "[context layout] a sequence of ", t,
                " positions (dimension ", dim, " of ", to_string(x.shape()),
                ") does not split into ", describe());
  const std::int64_t c = t / chunks();
  std::vector<Tensor> parts;
  for (int chunk : chunks_of(rank))
    parts.push_back(tensor::slice(x, dim, chunk * c, (chunk + 1) * c));
  return parts.size() == 1 ? parts[0] : tensor::concat(parts, dim);
}

Tensor ContextLayout::unshard(const std::vector<Tensor>& shares, int dim) const {
  DISTJAX_CHECK(static_cast<int>(shares.size()) == size, InvalidArgument,
                "[context layout] expected ", size, " shares, got ", shares.size());
  std::vector<Tensor> chunk(static_cast<std::size_t>(chunks()));
  for (int r = 0; r < size; ++r) {
    const std::vector<int> mine = chunks_of(r);
    const std::vector<Tensor> parts = tensor::split(shares[static_cast<std::size_t>(r)],
                                                    static_cast<int>(mine.size()), dim);
    for (std::size_t i = 0; i < mine.size(); ++i)
      chunk[static_cast<std::size_t>(mine[i])] = parts[i];
  }
  return tensor::concat(chunk, dim);
}

std::vector<std::int64_t> ContextLayout::chunk_starts(int rank, std::int64_t t) const {
  DISTJAX_CHECK(divides(t), InvalidArgument, "[context layout] a sequence of ", t,
                " positions does not split into ", describe());
  std::vector<std::int64_t> out;
  for (int chunk : chunks_of(rank))
    out.push_back(chunk * (t / chunks()));
  return out;
}

std::string ContextLayout::describe() const {
  return std::string(balanced ? "balanced" : "plain") + " (" + std::to_string(chunks()) +
         " chunks over " + std::to_string(size) + " devices)";
}

std::int64_t context_attention_pairs(const ContextLayout& layout, int rank, std::int64_t t,
                                     bool causal) {
  const std::vector<std::int32_t> pos = layout.positions(rank, t);
  std::int64_t pairs = 0;
  for (std::int32_t p : pos)
    pairs += causal ? p + 1 : t;
  return pairs;
}

// ------------------------------------------------------------------------ ring

Tensor ring_attention(spmd::DeviceContext& ctx, const Tensor& q_in, const Tensor& k_in,
                      const Tensor& v_in, const mesh::Axes& axis, const ContextLayout& layout,
                      bool causal, float scale, bool overlap) {
  const char* op = "ring_attention";
  check_qkv(q_in, k_in, v_in, op);
  // Each device's tokens are its own (a replicated input's cotangent is their sum).
  const Tensor q = spmd::pvary(ctx, q_in, axis), k = spmd::pvary(ctx, k_in, axis),
               v = spmd::pvary(ctx, v_in, axis);
  const int n = ctx.axis_size(axis), me = ctx.axis_index(axis);
  check_layout(layout, n, op);
  const std::int64_t b = q.size(0), t = q.size(2) * n;
  const auto perm = spmd::ring_permutation(n, 1);
  // The positions of every device's block: the one in hand at step s came from (me - s).
  std::vector<Tensor> pos(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    pos[static_cast<std::size_t>(r)] = position_tensor(layout, r, t);
  const Tensor qpos = pos[static_cast<std::size_t>(me)];

  tensor::AttentionPart whole;
  {
    tensor::NoGradGuard no_tape;
    const Tensor qd = q.detach();
    Tensor kv = tensor::concat({k.detach(), v.detach()}, 0);  // one transfer per hop
    for (int s = 0; s < n; ++s) {
      spmd::PermuteHandle next;
      if (s + 1 < n) next = spmd::ppermute_start(ctx, kv, axis, perm);
      Tensor held = kv;
      if (!overlap && s + 1 < n) kv = spmd::ppermute_done(next);  // wait before computing
      const Tensor& kpos = pos[static_cast<std::size_t>(mod(me - s, n))];
      tensor::AttentionPart part = tensor::attention_block(
          qd, tensor::slice(held, 0, 0, b), tensor::slice(held, 0, b, 2 * b), qpos, kpos, causal,
          scale);
      ctx.counters().attention_pairs += part.pairs;
      if (s == 0) whole = std::move(part);
      else tensor::attention_merge(whole, part);
      if (overlap && s + 1 < n) kv = spmd::ppermute_done(next);
    }
  }
  // Recorded (or, without a tape, given the varying axes of q, k and v).
  return tensor::record(
      op, {q, k, v}, whole.out,
      [&ctx, axis, n, me, b, causal, scale, overlap, perm, pos, qd = q.detach(), kd = k.detach(),
       vd = v.detach(), whole = tensor::AttentionPart{whole.out.detach(), whole.lse}](
          const std::vector<Tensor>& g) {
        // Step s: the block of (me - s) with the gradients it gathered on the devices before
        // this one; after this device's share it moves on, overlapped with the next step.
        const Tensor& qpos = pos[static_cast<std::size_t>(me)];
        // No cotangent reached the output on this device: its share is zero (the ring still
        // runs, so the other devices' gradients pass through).
        const Tensor go = g[0].defined() ? g[0] : Tensor::zeros(qd.shape(), DType::F32, qd.device());
        Tensor kv = tensor::concat({kd, vd}, 0), dq, dkv;
        spmd::PermuteHandle kv_next, dkv_next;
        for (int s = 0; s < n; ++s) {
          if (s + 1 < n) kv_next = spmd::ppermute_start(ctx, kv, axis, perm);
          Tensor held = kv, arrived;
          if (!overlap) {  // every transfer done before the compute
            if (s + 1 < n) kv = spmd::ppermute_done(kv_next);
            if (s > 0) arrived = spmd::ppermute_done(dkv_next);
          }
          const Tensor& kpos = pos[static_cast<std::size_t>(mod(me - s, n))];
          tensor::AttentionGrads part = tensor::attention_block_backward(
              qd, tensor::slice(held, 0, 0, b), tensor::slice(held, 0, b, 2 * b), qpos, kpos,
              whole, go, causal, scale);
          dq = s == 0 ? part.dq : tensor::add(dq, part.dq);
          Tensor mine = tensor::concat({part.dk, part.dv}, 0);
          if (overlap && s > 0) arrived = spmd::ppermute_done(dkv_next);
          dkv = s == 0 ? mine : tensor::add(arrived, mine);
          dkv_next = spmd::ppermute_start(ctx, dkv, axis, perm);
          if (overlap && s + 1 < n) kv = spmd::ppermute_done(kv_next);
        }
        dkv = spmd::ppermute_done(dkv_next);  // the n-th hop: this device's own block
        return std::vector<Tensor>{dq, tensor::slice(dkv, 0, 0, b), tensor::slice(dkv, 0, b, 2 * b)};
      });
}

// ------------------------------------------------------------------------ Ulysses

Tensor ulysses_attention(spmd::DeviceContext& ctx, const Tensor& q, const Tensor& k,
                         const Tensor& v, const mesh::Axes& axis, const ContextLayout& layout,
                         bool causal, float scale) {
  const char* op = "ulysses_attention";
  check_qkv(q, k, v, op);
  const int n = ctx.axis_size(axis);
  check_layout(layout, n, op);
  DISTJAX_CHECK(q.size(1) % n == 0, InvalidArgument, "[", op, "] ", q.size(1),
                " heads do not split over ", n, " devices of the context axis");
  // (B, H, T/n, D) -> (B, H/n, T, D): the sequence of every device side by side, device order.
  // Put in order: device r's share holds its chunks, so the whole is unshard of the shares.
  const auto whole_sequence = [&](const Tensor& x) {
    const Tensor side = spmd::all_to_all(ctx, x, axis, 1, 2);
    return layout.unshard(tensor::split(side, n, 2), 2);
  };
  const Tensor o = tensor::attention(whole_sequence(q), whole_sequence(k), whole_sequence(v),
                                     causal, scale);
  // Back: every device's share of the sequence, side by side in device order, and traded.
  std::vector<Tensor> shares;
  for (int r = 0; r < n; ++r)
    shares.push_back(layout.shard(o, 2, r));
  return spmd::all_to_all(ctx, tensor::concat(shares, 2), axis, 2, 1);
}

// ------------------------------------------------------------------------ in a model

nn::Dropout context_dropout(nn::Dropout drop, const spmd::DeviceContext* ctx,
                            const ContextPlan& plan, std::int64_t local_t) {
  if (!plan.active()) return drop;
  const std::int64_t t = local_t * plan.layout.size;
  DISTJAX_CHECK(ctx != nullptr, InvalidArgument,
                "[context_dropout] a context split needs a scope bound to a device");
  drop.sequence_starts = plan.layout.chunk_starts(ctx->axis_index(plan.axis), t);
  drop.sequence_length = t;
  return drop;
}

ContextMethod context_method_from_name(const std::string& name) {
  if (name == "ring") return ContextMethod::Ring;
  if (name == "ulysses") return ContextMethod::Ulysses;
  DISTJAX_THROW(InvalidArgument, "[context parallelism] unknown method \"", name,
                "\" (ring or ulysses)");
}

const char* context_method_name(ContextMethod m) {
  return m == ContextMethod::Ring ? "ring" : "ulysses";
}

Tensor context_attention_packed(spmd::DeviceContext& ctx, const Tensor& qkv,
                                std::int64_t num_heads, bool causal, const ContextPlan& plan) {
  tensor::check_defined(qkv, "context_attention_packed", "qkv");
  DISTJAX_CHECK(qkv.rank() == 3 && num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0,
                InvalidArgument, "[context_attention_packed] expected qkv (B, T/n, 3 H D) with H = ",
                num_heads, " heads, got ", to_string(qkv.shape()));
  const std::int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / (3 * num_heads);
  // (B, T, H, 3, D) -> (3, B, H, T, D): q, k and v of every head.
  const Tensor heads = tensor::permute(
      tensor::reshape(tensor::astype(qkv, DType::F32), {b, t, num_heads, 3, d}), {3, 0, 2, 1, 4});
  const std::vector<Tensor> parts = tensor::split(heads, 3, 0);
  const Shape shape{b, num_heads, t, d};
  const Tensor q = tensor::reshape(parts[0], shape), k = tensor::reshape(parts[1], shape),
               v = tensor::reshape(parts[2], shape);
  const Tensor o = plan.method == ContextMethod::Ring
                       ? ring_attention(ctx, q, k, v, plan.axis, plan.layout, causal, 0.f,
                                        plan.overlap)
                       : ulysses_attention(ctx, q, k, v, plan.axis, plan.layout, causal);
  return tensor::reshape(tensor::permute(o, {0, 2, 1, 3}), {b, t, num_heads * d});
}

}  // namespace distjax::parallel
