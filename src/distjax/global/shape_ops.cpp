#include "distjax/global/shape_ops.hpp"

#include "distjax/core/shape.hpp"
#include "distjax/global/detail/rule_util.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::global {

using detail::Entry;

namespace {

GlobalArray run(const char* op, const OpRule& r, const std::vector<GlobalArray>& xs,
                const std::function<Tensor(const std::vector<Tensor>&)>& fn, Shape shape) {
  const std::uint32_t keep = detail::sharding_mask(xs[0].ctx(), r.output);
  std::vector<GlobalArray> moved;
  for (std::size_t i = 0; i < xs.size(); ++i)
    moved.push_back(reshard(xs[i], r.inputs[i], op, keep));
  return GlobalArray(xs[0].ctx(), fn(detail::join_varying(op, moved)), std::move(shape), r.output);
}

}  // namespace

OpRule reshape_rule(const Shape& in, const GlobalSharding& s, const Shape& out, const Mesh& mesh) {
  DISTJAX_CHECK(numel(in) == numel(out), InvalidArgument, "[global::reshape] cannot reshape ",
                to_string(in), " to ", to_string(out));
  const auto e = dim_entries(s, static_cast<int>(in.size()));
  std::vector<Entry> ein(in.size()), eout(out.size());
  std::size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    // One group: the shortest runs of dimensions with equal products (size-1 dims alone).
    const std::size_t i0 = i, o0 = o;
    std::int64_t pi = i < in.size() ? in[i++] : 1, po = o < out.size() ? out[o++] : 1;
    while (pi != po) {
      if (pi < po)
        pi *= in[i++];
      else
        po *= out[o++];
    }
    if (i0 < in.size() && o0 < out.size() && !e[i0].empty() &&
        out[o0] % detail::split_devices(e[i0], mesh) == 0) {
      ein[i0] = e[i0];
      eout[o0] = e[i0];
    }
  }
  OpRule r;
  r.inputs.push_back(make_sharding(ein, s.partial, mesh));
  r.output = make_sharding(eout, s.partial, mesh);
  r.bytes = redistribution_bytes(in, s, r.inputs[0], mesh);
  return r;
}

GlobalArray reshape(const GlobalArray& x, const Shape& shape) {
  const OpRule r = reshape_rule(x.shape(), x.sharding(), shape, x.mesh());
  const Shape local = local_shape(shape, r.output, x.mesh());
  return run(
      "reshape", r, {x}, [&](const std::vector<Tensor>& t) { return tensor::reshape(t[0], local); },
      shape);
}

GlobalArray permute(const GlobalArray& x, const std::vector<int>& perm) {
  const auto e = dim_entries(x.sharding(), x.rank());
  std::vector<Entry> eo;
  Shape shape;
  for (int p : perm) {
    eo.push_back(e[static_cast<std::size_t>(p)]);
    shape.push_back(x.shape()[static_cast<std::size_t>(p)]);
  }
  OpRule r{{x.sharding()}, make_sharding(eo, x.sharding().partial, x.mesh()), 0};
  return run(
      "permute", r, {x}, [&](const std::vector<Tensor>& t) { return tensor::permute(t[0], perm); },
      shape);
}

GlobalArray transpose(const GlobalArray& x, int d0, int d1) {
  std::vector<int> perm(static_cast<std::size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i)
    perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(normalize_axis(d0, x.rank(), "global::transpose"))],
            perm[static_cast<std::size_t>(normalize_axis(d1, x.rank(), "global::transpose"))]);
  return permute(x, perm);
}

OpRule slice_rule(const Shape& shape, const GlobalSharding& s, int axis, std::int64_t start,
                  std::int64_t end, const Mesh& mesh) {
  const int a = normalize_axis(axis, static_cast<int>(shape.size()), "global::slice");
  auto e = dim_entries(s, static_cast<int>(shape.size()));
  if (!(start == 0 && end == shape[static_cast<std::size_t>(a)]))
    e[static_cast<std::size_t>(a)].clear();
  OpRule r;
  r.inputs.push_back(make_sharding(e, s.partial, mesh));
  r.output = r.inputs[0];
  r.bytes = redistribution_bytes(shape, s, r.inputs[0], mesh);
  return r;
}

GlobalArray slice(const GlobalArray& x, int axis, std::int64_t start, std::int64_t end) {
  const OpRule r = slice_rule(x.shape(), x.sharding(), axis, start, end, x.mesh());
  const int a = normalize_axis(axis, x.rank(), "global::slice");
  Shape shape = x.shape();
  shape[static_cast<std::size_t>(a)] = end - start;
  if (end - start == x.size(a)) return x;
  return run(
      "slice", r, {x},
      [&](const std::vector<Tensor>& t) { return tensor::slice(t[0], a, start, end); }, shape);
}

OpRule concat_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                   int axis, const Mesh& mesh) {
  const int rank = static_cast<int>(shapes[0].size());
  const int a = normalize_axis(axis, rank, "global::concat");
  auto e = dim_entries(in[0], rank);
  e[static_cast<std::size_t>(a)].clear();
  std::vector<std::string> partial;
  for (const auto& p : in[0].partial) {
    bool all = true;
    for (const auto& s : in)
      all = all && s.is_partial(p);
    if (all) partial.push_back(p);
  }
  OpRule r;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    r.inputs.push_back(make_sharding(e, partial, mesh));
    r.bytes += redistribution_bytes(shapes[i], in[i], r.inputs.back(), mesh);
  }
  r.output = make_sharding(e, partial, mesh);
  return r;
}

GlobalArray concat(const std::vector<GlobalArray>& xs, int axis) {
  std::vector<Shape> shapes;
  std::vector<GlobalSharding> in;
  for (const auto& x : xs) {
    shapes.push_back(x.shape());
    in.push_back(x.sharding());
  }
  const OpRule r = concat_rule(shapes, in, axis, xs[0].mesh());
  const int a = normalize_axis(axis, xs[0].rank(), "global::concat");
  Shape shape = xs[0].shape();
  shape[static_cast<std::size_t>(a)] = 0;
  for (const auto& x : xs)
    shape[static_cast<std::size_t>(a)] += x.size(a);
  return run(
      "concat", r, xs, [&](const std::vector<Tensor>& t) { return tensor::concat(t, a); }, shape);
}

}  // namespace distjax::global
