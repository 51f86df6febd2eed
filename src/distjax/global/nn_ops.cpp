#include "distjax/global/nn_ops.hpp"

#include "distjax/core/shape.hpp"
#include "distjax/global/comm_plan.hpp"
#include "distjax/global/detail/rule_util.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/parallel_ops.hpp"

namespace distjax::global {

using detail::Entry;

namespace {

// The inputs moved to `rule.inputs`, joined for the local op.
std::vector<Tensor> prepare(const char* op, const OpRule& rule,
                            const std::vector<GlobalArray>& xs) {
  const std::uint32_t keep = detail::sharding_mask(xs[0].ctx(), rule.output);
  std::vector<GlobalArray> moved;
  for (std::size_t i = 0; i < xs.size(); ++i)
    moved.push_back(reshard(xs[i], rule.inputs[i], op, keep));
  return detail::join_varying(op, moved);
}

std::int64_t bytes_of(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& from,
                      const std::vector<GlobalSharding>& to, const Mesh& mesh) {
  std::int64_t b = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    b += redistribution_bytes(shapes[i], from[i], to[i], mesh);
  return b;
}

}  // namespace

OpRule softmax_rule(const Shape& shape, const GlobalSharding& s, int axis, const Mesh& mesh) {
  const int r = static_cast<int>(shape.size());
  auto e = dim_entries(s, r);
  e[static_cast<std::size_t>(normalize_axis(axis, r, "global::softmax"))].clear();
  OpRule rule;
  rule.inputs.push_back(make_sharding(e, {}, mesh));
  rule.output = rule.inputs[0];
  rule.bytes = redistribution_bytes(shape, s, rule.inputs[0], mesh);
  return rule;
}

GlobalArray softmax(const GlobalArray& x, int axis) {
  const OpRule r = softmax_rule(x.shape(), x.sharding(), axis, x.mesh());
  const auto t = prepare("softmax", r, {x});
  return GlobalArray(x.ctx(), tensor::softmax(t[0], axis), x.shape(), r.output);
}

GlobalArray log_softmax(const GlobalArray& x, int axis) {
  const OpRule r = softmax_rule(x.shape(), x.sharding(), axis, x.mesh());
  const auto t = prepare("log_softmax", r, {x});
  return GlobalArray(x.ctx(), tensor::log_softmax(t[0], axis), x.shape(), r.output);
}

OpRule norm_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                 const Mesh& mesh) {
  const int r = static_cast<int>(shapes[0].size());
  auto e = dim_entries(in[0], r);
  e.back().clear();
  OpRule rule;
  rule.inputs.push_back(make_sharding(e, {}, mesh));
  for (std::size_t i = 1; i < shapes.size(); ++i)
    rule.inputs.push_back(GlobalSharding{});
  rule.output = rule.inputs[0];
  rule.bytes = bytes_of(shapes, in, rule.inputs, mesh);
  return rule;
}

GlobalArray layer_norm(const GlobalArray& x, const GlobalArray& gamma, const GlobalArray& beta,
                       float eps) {
  std::vector<GlobalArray> xs{x, gamma};
  if (beta.defined()) xs.push_back(beta);
  std::vector<Shape> shapes;
  std::vector<GlobalSharding> in;
  for (const auto& v : xs) {
    shapes.push_back(v.shape());
    in.push_back(v.sharding());
  }
  const OpRule r = norm_rule(shapes, in, x.mesh());
  const auto t = prepare("layer_norm", r, xs);
  return GlobalArray(x.ctx(), tensor::layer_norm(t[0], t[1], beta.defined() ? t[2] : Tensor(), eps),
                     x.shape(), r.output);
}

GlobalArray rms_norm(const GlobalArray& x, const GlobalArray& gamma, float eps) {
  const OpRule r =
      norm_rule({x.shape(), gamma.shape()}, {x.sharding(), gamma.sharding()}, x.mesh());
  const auto t = prepare("rms_norm", r, {x, gamma});
  return GlobalArray(x.ctx(), tensor::rms_norm(t[0], t[1], eps), x.shape(), r.output);
}

OpRule embedding_rule(const Shape& table, const GlobalSharding& st, const Shape& ids,
                      const GlobalSharding& si, const Mesh& mesh) {
  const auto et = dim_entries(st, 2);
  std::vector<std::string> used = et[0];
  used.insert(used.end(), et[1].begin(), et[1].end());
  auto ei = dim_entries(si, static_cast<int>(ids.size()));
  for (auto& e : ei) {
    bool clash = false;
    for (const auto& a : e)
      clash = clash || detail::contains(used, a);
    if (clash) e.clear();
  }
  OpRule rule;
  rule.inputs.push_back(make_sharding(et, {}, mesh));
  rule.inputs.push_back(make_sharding(ei, {}, mesh));
  auto eo = ei;
  eo.push_back(et[1]);
  rule.output = make_sharding(eo, et[0], mesh);
  rule.bytes = bytes_of({table, ids}, {st, si}, rule.inputs, mesh);
  return rule;
}

GlobalArray embedding(const GlobalArray& table, const GlobalArray& ids) {
  const OpRule r =
      embedding_rule(table.shape(), table.sharding(), ids.shape(), ids.sharding(), table.mesh());
  const auto t = prepare("embedding", r, {table, ids});
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  const Entry ev = r.inputs[0].dim_axes(0);
  if (ev.empty()) return GlobalArray(table.ctx(), tensor::embedding(t[0], t[1]), shape, r.output);
  // Vocabulary-parallel: look up the ids of this device's rows, zeros for the others.
  DeviceContext& ctx = table.ctx();
  const std::int64_t rows = t[0].size(0), lo = ctx.axis_index(mesh::Axes(ev)) * rows;
  tensor::ShardIds local = tensor::shard_ids(t[1].detach(), lo, rows, /*bound=*/-1);
  Shape mshape = t[1].shape();
  mshape.push_back(1);
  Tensor mask = local.keep.view(mshape);
  // Built per device from the ids: they vary where the ids do (and where the rows do).
  local.local.set_varying_axes(t[1].varying_axes());
  mask.set_varying_axes(t[1].varying_axes() | t[0].varying_axes());
  return GlobalArray(ctx, tensor::mul(tensor::embedding(t[0], local.local), mask), shape, r.output);
}

OpRule cross_entropy_rule(const Shape& logits, const GlobalSharding& sl, const Shape& labels,
                          const GlobalSharding& sy, const Mesh& mesh) {
  const int r = static_cast<int>(logits.size());
  auto e = dim_entries(sl, r);
  Entry ev = e.back();
  const std::int64_t rows = numel(logits) / logits.back();
  // Vocabulary-parallel keeps V split: 3 all-reduces of `rows` floats per device group
  // (psum bytes 2 (n-1)/n each), against gathering the logits.
  if (!ev.empty()) {
    std::int64_t n = detail::split_devices(ev, mesh);
    auto gathered = e;
    gathered.back().clear();
    std::int64_t per_rows = rows;
    for (std::size_t d = 0; d + 1 < e.size(); ++d)
      per_rows /= detail::split_devices(e[d], mesh);
    const std::int64_t vp = 3 * 2 * (n - 1) * (per_rows * 4 / n);
    const std::int64_t gather = redistribution_bytes(logits, GlobalSharding{sl.spec},
                                                     make_sharding(gathered, {}, mesh), mesh);
    if (gather <= vp) ev.clear();
  }
  std::vector<Entry> lead(e.begin(), e.end() - 1);
  auto ein = lead;
  ein.push_back(ev);
  OpRule rule;
  rule.inputs.push_back(make_sharding(ein, {}, mesh));
  rule.inputs.push_back(make_sharding(lead, {}, mesh));
  rule.output = make_sharding(lead, {}, mesh);
  rule.bytes = bytes_of({logits, labels}, {sl, sy}, rule.inputs, mesh);
  return rule;
}

GlobalArray cross_entropy(const GlobalArray& logits, const GlobalArray& labels) {
  const OpRule r = cross_entropy_rule(logits.shape(), logits.sharding(), labels.shape(),
                                      labels.sharding(), logits.mesh());
  const auto t = prepare("cross_entropy", r, {logits, labels});
  const Entry ev = r.inputs[0].dim_axes(logits.rank() - 1);
  if (ev.empty())
    return GlobalArray(logits.ctx(), tensor::cross_entropy(t[0], t[1]), labels.shape(), r.output);
  DeviceContext& ctx = logits.ctx();
  const mesh::Axes axes(ev);
  const std::int64_t n = ctx.axis_size(axes);
  const std::int64_t b = static_cast<std::int64_t>(t[1].numel()) * 4;
  for (int i = 0; i < 3; ++i)
    record({"cross_entropy", "all_reduce", ctx.comm_label(axes), 2 * (n - 1) * (b / n),
            PlanEntry::Phase::Forward,
            "vocabulary-parallel row " + std::string(i == 0   ? "max"
                                                     : i == 1 ? "sum of exp"
                                                              : "target logit")});
  return GlobalArray(ctx, parallel::vocab_parallel_cross_entropy(&ctx, t[0], t[1], axes),
                     labels.shape(), r.output);
}

}  // namespace distjax::global
