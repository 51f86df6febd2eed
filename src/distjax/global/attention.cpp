#include "distjax/global/attention.hpp"

#include "distjax/global/detail/rule_util.hpp"
#include "distjax/tensor/attention.hpp"

namespace distjax::global {

using detail::Entry;

OpRule attention_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                      const Mesh& mesh) {
  DISTJAX_CHECK(shapes[0].size() == 4, InvalidArgument,
                "[global::attention] expected q (B, H, T, D), got ", to_string(shapes[0]));
  auto e = dim_entries(in[0], 4);
  e[2].clear();
  e[3].clear();
  OpRule r;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    r.inputs.push_back(make_sharding(e, {}, mesh));
    r.bytes += redistribution_bytes(shapes[i], in[i], r.inputs.back(), mesh);
  }
  r.output = r.inputs[0];
  return r;
}

GlobalArray attention(const GlobalArray& q, const GlobalArray& k, const GlobalArray& v,
                      bool causal) {
  const OpRule r = attention_rule({q.shape(), k.shape(), v.shape()},
                                  {q.sharding(), k.sharding(), v.sharding()}, q.mesh());
  const std::uint32_t keep = detail::sharding_mask(q.ctx(), r.output);
  std::vector<GlobalArray> moved{reshard(q, r.inputs[0], "attention", keep),
                                 reshard(k, r.inputs[1], "attention", keep),
                                 reshard(v, r.inputs[2], "attention", keep)};
  const auto t = detail::join_varying("attention", moved);
  Tensor out = tensor::attention(t[0], t[1], t[2], causal);
  // q k^T and p v: 4 x (B, H, T) x T x head size, locally (causal or not, as computed).
  detail::record_compute(
      q.ctx(), "attention",
      4.0 * static_cast<double>(out.numel()) * static_cast<double>(t[1].size(-2)), r.output);
  return GlobalArray(q.ctx(), std::move(out), q.shape(), r.output);
}

OpRule attention_packed_rule(const Shape& shape, const GlobalSharding& s, std::int64_t num_heads,
                             const Mesh& mesh) {
  DISTJAX_CHECK(shape.size() == 3 && shape[2] % (3 * num_heads) == 0, InvalidArgument,
                "[global::attention_packed] expected qkv (B, T, 3C) with C divisible by ",
                num_heads, " heads, got ", to_string(shape));
  auto e = dim_entries(s, 3);
  e[1].clear();
  if (!e[2].empty() && num_heads % detail::split_devices(e[2], mesh) != 0) e[2].clear();
  OpRule r;
  r.inputs.push_back(make_sharding(e, {}, mesh));
  r.output = r.inputs[0];
  r.bytes = redistribution_bytes(shape, s, r.inputs[0], mesh);
  return r;
}

GlobalArray attention_packed(const GlobalArray& qkv, std::int64_t num_heads, bool causal) {
  const OpRule r = attention_packed_rule(qkv.shape(), qkv.sharding(), num_heads, qkv.mesh());
  const GlobalArray m =
      reshard(qkv, r.inputs[0], "attention", detail::sharding_mask(qkv.ctx(), r.output));
  const std::int64_t n = detail::split_devices(r.inputs[0].dim_axes(2), qkv.mesh());
  Shape shape = qkv.shape();
  shape[2] /= 3;
  Tensor out = tensor::attention_packed(m.local(), num_heads / n, causal);
  // (B, T, H D) local: 4 x its elements x T keys.
  detail::record_compute(qkv.ctx(), "attention",
                         4.0 * static_cast<double>(out.numel()) * static_cast<double>(out.size(1)),
                         r.output);
  return GlobalArray(qkv.ctx(), std::move(out), shape, r.output);
}

}  // namespace distjax::global
