#include "distjax/global/matmul.hpp"

#include <algorithm>
#include <set>

#include "distjax/core/error.hpp"
#include "distjax/global/detail/rule_util.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::global {

using detail::Entry;

OpRule matmul_rule(const Shape& a, const GlobalSharding& sa, const Shape& b,
                   const GlobalSharding& sb, const Mesh& mesh, bool trans_b) {
  const int ra = static_cast<int>(a.size()), rb = static_cast<int>(b.size());
  DISTJAX_CHECK(ra >= 2 && (rb == 2 || rb == ra), InvalidArgument,
                "[global::matmul] expected a (..., M, K) and b (K, N) or (..., K, N), got ",
                to_string(a), " and ", to_string(b));
  const int nb = ra - 2;  // batch dims
  const bool batched_b = rb == ra;
  const auto ea = dim_entries(sa, ra), eb = dim_entries(sb, rb);
  const int bk = trans_b ? rb - 1 : rb - 2, bn = trans_b ? rb - 2 : rb - 1;
  // Options per dimension.
  std::vector<std::vector<Entry>> opts;
  for (int i = 0; i < nb; ++i) {
    std::vector<Entry> o{ea[static_cast<std::size_t>(i)], {}};
    if (batched_b) o.push_back(eb[static_cast<std::size_t>(i)]);
    opts.push_back(detail::unique_entries(o));
  }
  opts.push_back(detail::unique_entries({ea[static_cast<std::size_t>(ra - 2)], {}}));  // M
  opts.push_back(detail::unique_entries({eb[static_cast<std::size_t>(bn)], {}}));      // N
  opts.push_back(detail::unique_entries(
      {ea[static_cast<std::size_t>(ra - 1)], eb[static_cast<std::size_t>(bk)], {}}));  // K
  detail::Best best;
  detail::for_each_choice(opts, [&](const std::vector<Entry>& pick) {
    const Entry& m = pick[static_cast<std::size_t>(nb)];
    const Entry& n = pick[static_cast<std::size_t>(nb + 1)];
    const Entry& k = pick[static_cast<std::size_t>(nb + 2)];
    std::vector<Entry> da(pick.begin(), pick.begin() + nb), db, dout = da;
    da.push_back(m);
    da.push_back(k);
    if (batched_b) db.assign(pick.begin(), pick.begin() + nb);
    db.resize(static_cast<std::size_t>(rb));
    db[static_cast<std::size_t>(bk)] = k;
    db[static_cast<std::size_t>(bn)] = n;
    dout.push_back(m);
    dout.push_back(n);
    std::vector<std::string> used;
    for (const auto& e : pick)
      used.insert(used.end(), e.begin(), e.end());
    if (!detail::distinct(used)) return;
    // Partial sums pass through the product when the other side is replicated along them.
    std::vector<std::string> pa, pb;
    for (const auto& p : sa.partial)
      if (!detail::contains(used, p)) pa.push_back(p);
    for (const auto& p : sb.partial)
      if (!detail::contains(used, p) && !detail::contains(pa, p)) pb.push_back(p);
    GlobalSharding ta = make_sharding(da, pa, mesh), tb = make_sharding(db, pb, mesh);
    std::vector<std::string> pout = pa;
    pout.insert(pout.end(), pb.begin(), pb.end());
    pout.insert(pout.end(), k.begin(), k.end());
    Shape out_shape(a.begin(), a.end() - 1);
    out_shape.push_back(b[static_cast<std::size_t>(bn)]);
    GlobalSharding out = make_sharding(dout, pout, mesh);
    if (!is_valid_sharding(a, ta, mesh) || !is_valid_sharding(b, tb, mesh) ||
        !is_valid_sharding(out_shape, out, mesh))
      return;
    const std::int64_t bytes =
        redistribution_bytes(a, sa, ta, mesh) + redistribution_bytes(b, sb, tb, mesh);
    // A split contraction leaves partial sums that some consumer will all-reduce: count
    // that too, so a contraction is split only where it saves more than it defers.
    const std::int64_t deferred =
        k.empty() ? 0
                  : redistribution_bytes(out_shape, make_sharding(dout, k, mesh),
                                         make_sharding(dout, {}, mesh), mesh);
    best.offer(OpRule{{ta, tb}, out, bytes}, bytes + deferred, detail::split_devices(used, mesh));
  });
  return best.get("matmul");
}

GlobalArray matmul(const GlobalArray& a, const GlobalArray& b, bool trans_b) {
  const OpRule r = matmul_rule(a.shape(), a.sharding(), b.shape(), b.sharding(), a.mesh(), trans_b);
  const std::uint32_t keep = detail::sharding_mask(a.ctx(), r.output);
  const GlobalArray ra = reshard(a, r.inputs[0], "matmul", keep);
  const GlobalArray rb = reshard(b, r.inputs[1], "matmul", keep);
  const auto t = detail::join_varying("matmul", {ra, rb});
  Shape shape(a.shape().begin(), a.shape().end() - 1);
  shape.push_back(b.size(trans_b ? -2 : -1));
  Tensor out = tensor::matmul(t[0], t[1], false, trans_b);
  // 2 x (rows x columns of the local output) x the local contraction.
  detail::record_compute(
      a.ctx(), "matmul",
      2.0 * static_cast<double>(out.numel()) * static_cast<double>(t[0].size(-1)), r.output);
  return GlobalArray(a.ctx(), std::move(out), shape, r.output);
}

}  // namespace distjax::global
