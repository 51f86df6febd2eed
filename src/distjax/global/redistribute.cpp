#include "distjax/global/redistribute.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"

namespace distjax::global {

const char* step_name(RedistStep::Kind k) {
  switch (k) {
    case RedistStep::Kind::AllGather:
      return "all_gather";
    case RedistStep::Kind::AllToAll:
      return "all_to_all";
    case RedistStep::Kind::AllReduce:
      return "all_reduce";
    case RedistStep::Kind::ReduceScatter:
      return "reduce_scatter";
    case RedistStep::Kind::Split:
      return "split";
    case RedistStep::Kind::ToPartial:
      return "to_partial";
  }
  return "?";
}

bool step_communicates(RedistStep::Kind k) {
  return k != RedistStep::Kind::Split && k != RedistStep::Kind::ToPartial;
}

namespace {

using Dims = std::vector<std::vector<std::string>>;

bool is_prefix(const std::vector<std::string>& p, const std::vector<std::string>& of) {
  return p.size() <= of.size() && std::equal(p.begin(), p.end(), of.begin());
}

bool contains(const std::vector<std::string>& v, const std::string& a) {
  return std::find(v.begin(), v.end(), a) != v.end();
}

// Builds the step list while tracking the local shape.
struct Planner {
  const Mesh& mesh;
  std::int64_t elem;
  Shape local;
  std::vector<RedistStep> steps;

  std::int64_t group(const std::vector<std::string>& axes) const {
    std::int64_t n = 1;
    for (const auto& a : axes)
      n *= mesh.axis_size(a);
    return n;
  }
  std::int64_t local_bytes() const { return numel(local) * elem; }

  void push(RedistStep::Kind kind, std::vector<std::string> axes, int dim, int dim2) {
    RedistStep s{kind, std::move(axes), dim, dim2, 0, local, local};
    const std::int64_t n = group(s.axes), b = local_bytes();
    using K = RedistStep::Kind;
    switch (kind) {
      case K::AllGather:
        s.bytes = (n - 1) * b;
        s.local_out[static_cast<std::size_t>(dim)] *= n;
        break;
      case K::AllToAll:
        s.bytes = (n - 1) * (b / n);
        s.local_out[static_cast<std::size_t>(dim)] /= n;
        s.local_out[static_cast<std::size_t>(dim2)] *= n;
        break;
      case K::AllReduce:
        s.bytes = 2 * (n - 1) * (b / n);
        break;
      case K::ReduceScatter:
        s.bytes = (n - 1) * (b / n);
        s.local_out[static_cast<std::size_t>(dim)] /= n;
        break;
      case K::Split:
        s.local_out[static_cast<std::size_t>(dim)] /= n;
        break;
      case K::ToPartial:
        break;
    }
    local = s.local_out;
    steps.push_back(std::move(s));
  }
};

}  // namespace

std::vector<RedistStep> plan_redistribution(const Shape& global, const GlobalSharding& from,
                                            const GlobalSharding& to, const Mesh& mesh,
                                            std::int64_t elem_size) {
  check_sharding(global, from, mesh, "reshard", "source");
  check_sharding(global, to, mesh, "reshard", "target");
  const int rank = static_cast<int>(global.size());
  Dims cur = dim_entries(from, rank);
  const Dims want = dim_entries(to, rank);
  std::vector<std::string> partial = from.partial;
  Planner p{mesh, elem_size, local_shape(global, from, mesh), {}};
  using K = RedistStep::Kind;

  // (0) Partial axes the target neither keeps nor splits a dimension over: all-reduce
  // them first, while the local block is smallest.
  {
    std::vector<std::string> early;
    for (const auto& a : partial)
      if (!contains(to.partial, a) && !to.spec.uses(a)) early.push_back(a);
    if (!early.empty()) {
      p.push(K::AllReduce, early, -1, -1);
      std::erase_if(partial, [&](const std::string& a) { return contains(early, a); });
    }
  }

  // (1) Drop axes not at their target place, minor end first. An axis the target wants
  // next in another dimension moves there by all_to_all; the others are gathered (runs of
  // gathers on one dimension become one all_gather over their product).
  for (int d = 0; d < rank; ++d) {
    auto& c = cur[static_cast<std::size_t>(d)];
    std::size_t keep = 0;
    const auto& w = want[static_cast<std::size_t>(d)];
    while (keep < c.size() && keep < w.size() && c[keep] == w[keep])
      ++keep;
    std::vector<std::string> gather;  // minor first
    auto flush = [&] {
      if (gather.empty()) return;
      std::reverse(gather.begin(), gather.end());
      p.push(K::AllGather, gather, d, -1);
      gather.clear();
    };
    while (c.size() > keep) {
      const std::string a = c.back();
      int to_dim = -1;
      for (int e = 0; e < rank; ++e) {
        if (e == d) continue;
        const auto& ce = cur[static_cast<std::size_t>(e)];
        const auto& we = want[static_cast<std::size_t>(e)];
        if (is_prefix(ce, we) && ce.size() < we.size() && we[ce.size()] == a) to_dim = e;
      }
      if (to_dim >= 0) {
        flush();  // the axes minor to `a` go first, so `a` is at the minor end
        p.push(K::AllToAll, {a}, to_dim, d);
        cur[static_cast<std::size_t>(to_dim)].push_back(a);
      } else {
        gather.push_back(a);
      }
      c.pop_back();
    }
    flush();
  }

  // (2) Partial axes the target does not keep: reduce-scatter into the dimension that
  // wants the axis next, else all-reduce (all such axes in one group).
  std::vector<std::string> reduce;
  for (const auto& a : partial) {
    if (contains(to.partial, a)) continue;
    int into = -1;
    for (int e = 0; e < rank; ++e) {
      const auto& ce = cur[static_cast<std::size_t>(e)];
      const auto& we = want[static_cast<std::size_t>(e)];
      if (is_prefix(ce, we) && ce.size() < we.size() && we[ce.size()] == a) into = e;
    }
    if (into >= 0) {
      p.push(K::ReduceScatter, {a}, into, -1);
      cur[static_cast<std::size_t>(into)].push_back(a);
    } else {
      reduce.push_back(a);
    }
  }
  if (!reduce.empty()) p.push(K::AllReduce, reduce, -1, -1);

  // (3) Axes the target adds: local splits.
  for (int d = 0; d < rank; ++d) {
    const auto& c = cur[static_cast<std::size_t>(d)];
    const auto& w = want[static_cast<std::size_t>(d)];
    DISTJAX_CHECK(is_prefix(c, w), ShardingError, "[reshard] internal: dimension ", d,
                  " is not a prefix of its target");
    if (c.size() < w.size())
      p.push(K::Split,
             std::vector<std::string>(w.begin() + static_cast<std::ptrdiff_t>(c.size()), w.end()),
             d, -1);
  }

  // (4) New partial axes.
  std::vector<std::string> fresh;
  for (const auto& a : to.partial)
    if (!contains(partial, a)) fresh.push_back(a);
  if (!fresh.empty()) p.push(K::ToPartial, fresh, -1, -1);
  return p.steps;
}

std::int64_t redistribution_bytes(const Shape& global, const GlobalSharding& from,
                                  const GlobalSharding& to, const Mesh& mesh,
                                  std::int64_t elem_size) {
  std::int64_t b = 0;
  for (const auto& s : plan_redistribution(global, from, to, mesh, elem_size))
    b += s.bytes;
  return b;
}

}  // namespace distjax::global
