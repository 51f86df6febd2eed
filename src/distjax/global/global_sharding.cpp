#include "distjax/global/global_sharding.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::global {

bool GlobalSharding::uses(const std::string& axis) const {
  return spec.uses(axis) || is_partial(axis);
}

bool GlobalSharding::is_partial(const std::string& axis) const {
  return std::find(partial.begin(), partial.end(), axis) != partial.end();
}

std::vector<std::vector<std::string>> dim_entries(const GlobalSharding& s, int rank) {
  std::vector<std::vector<std::string>> dims(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d)
    dims[static_cast<std::size_t>(d)] = s.spec.entry(d).axes;
  return dims;
}

GlobalSharding make_sharding(const std::vector<std::vector<std::string>>& dims,
                             std::vector<std::string> partial, const Mesh& mesh) {
  std::vector<PartitionSpec::Entry> entries;
  int last = -1;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (!dims[d].empty()) last = static_cast<int>(d);
  for (int d = 0; d <= last; ++d)
    entries.emplace_back(dims[static_cast<std::size_t>(d)]);
  std::sort(partial.begin(), partial.end(), [&](const std::string& a, const std::string& b) {
    return mesh.axis_position(a) < mesh.axis_position(b);
  });
  partial.erase(std::unique(partial.begin(), partial.end()), partial.end());
  return GlobalSharding{PartitionSpec::from_entries(std::move(entries)), std::move(partial)};
}

GlobalSharding GlobalSharding::normalized(int rank, const Mesh& mesh) const {
  return make_sharding(dim_entries(*this, rank), partial, mesh);
}

std::string GlobalSharding::to_string() const {
  std::ostringstream os;
  os << spec.to_string();
  if (!partial.empty()) {
    os << " partial(";
    for (std::size_t i = 0; i < partial.size(); ++i)
      os << (i ? ", " : "") << '"' << partial[i] << '"';
    os << ")";
  }
  return os.str();
}

void check_sharding(const Shape& shape, const GlobalSharding& s, const Mesh& mesh, const char* op,
                    const std::string& what) {
  const int rank = static_cast<int>(shape.size());
  auto fail = [&](const std::string& why) {
    DISTJAX_CHECK(false, ShardingError, "[", op, "] ", what, " with shape ", to_string(shape),
                  ": sharding ", s.to_string(), " is invalid on mesh ", mesh.describe(), ": ", why);
  };
  if (s.spec.size() > rank) fail("the spec is longer than the rank");
  std::set<std::string> seen;
  auto use = [&](const std::string& a) {
    if (!mesh.has_axis(a)) fail("unknown axis \"" + a + "\"");
    if (!seen.insert(a).second) fail("axis \"" + a + "\" is used twice");
  };
  for (int d = 0; d < rank; ++d) {
    std::int64_t n = 1;
    for (const auto& a : s.spec.entry(d).axes) {
      use(a);
      n *= mesh.axis_size(a);
    }
    if (shape[static_cast<std::size_t>(d)] % n != 0)
      fail("dimension " + std::to_string(d) + " (" +
           std::to_string(shape[static_cast<std::size_t>(d)]) + ") is not divisible by " +
           std::to_string(n));
  }
  for (const auto& a : s.partial)
    use(a);
}

bool is_valid_sharding(const Shape& shape, const GlobalSharding& s, const Mesh& mesh) {
  const int rank = static_cast<int>(shape.size());
  if (s.spec.size() > rank) return false;
  std::set<std::string> seen;
  for (int d = 0; d < rank; ++d) {
    std::int64_t n = 1;
    for (const auto& a : s.spec.entry(d).axes) {
      if (!mesh.has_axis(a) || !seen.insert(a).second) return false;
      n *= mesh.axis_size(a);
    }
    if (shape[static_cast<std::size_t>(d)] % n != 0) return false;
  }
  for (const auto& a : s.partial)
    if (!mesh.has_axis(a) || !seen.insert(a).second) return false;
  return true;
}

Shape local_shape(const Shape& global, const GlobalSharding& s, const Mesh& mesh) {
  Shape out = global;
  for (std::size_t d = 0; d < out.size(); ++d)
    for (const auto& a : s.spec.entry(static_cast<int>(d)).axes)
      out[d] /= mesh.axis_size(a);
  return out;
}

}  // namespace distjax::global
