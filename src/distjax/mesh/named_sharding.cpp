// NamedSharding: spec validation against a mesh and an array shape, shard arithmetic.
#include "distjax/mesh/named_sharding.hpp"

#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::mesh {

namespace {

std::string axes_with_sizes(const Mesh& mesh, const std::vector<std::string>& axes) {
  if (axes.size() == 1) return "\"" + axes[0] + "\"=" + std::to_string(mesh.axis_size(axes[0]));
  std::string s = "(";
  int prod = 1;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const int n = mesh.axis_size(axes[i]);
    prod *= n;
    s += (i ? " x \"" : "\"") + axes[i] + "\"=" + std::to_string(n);
  }
  return s + " = " + std::to_string(prod) + ")";
}

// Checks that do not need an array shape; `prefix` starts the message.
void check_axes_of_spec(const Mesh& mesh, const PartitionSpec& spec, const std::string& prefix) {
  std::vector<std::string> seen;
  for (int d = 0; d < spec.size(); ++d) {
    for (const auto& a : spec.entries()[d].axes) {
      DISTJAX_CHECK(mesh.has_axis(a), ShardingError, prefix, "spec ", spec.to_string(),
                    " is invalid on mesh ", mesh.describe(), ": axis \"", a, "\" (dimension ", d,
                    ") is not in the mesh");
      for (const auto& s : seen)
        DISTJAX_CHECK(s != a, ShardingError, prefix, "spec ", spec.to_string(),
                      " is invalid on mesh ", mesh.describe(), ": axis \"", a,
                      "\" is used twice (a mesh axis can split only one dimension)");
      seen.push_back(a);
    }
  }
}

}  // namespace

PartitionSpec fully_sharded_spec(const Shape& shape, const PartitionSpec& spec, const Mesh& mesh,
                                 const std::string& axis, std::int64_t min_weight_size,
                                 int* dim) {
  if (dim != nullptr) *dim = -1;
  const int n = mesh.axis_size(axis, "fully_sharded_spec");
  if (spec.uses(axis) || numel(shape) < min_weight_size || shape.empty()) return spec;
  int best = -1;
  std::int64_t best_extent = 0;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    std::int64_t split = 1;
    for (const auto& a : spec.entry(d).axes)
      split *= mesh.axis_size(a, "fully_sharded_spec");
    if (shape[d] % split != 0) continue;
    const std::int64_t extent = shape[d] / split;
    if (extent % n == 0 && extent >= best_extent) {
      best = d;
      best_extent = extent;
    }
  }
  if (best < 0) return spec;
  std::vector<PartitionSpec::Entry> entries;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    std::vector<std::string> axes = spec.entry(d).axes;
    if (d == best) axes.push_back(axis);
    entries.emplace_back(axes);
  }
  if (dim != nullptr) *dim = best;
  return PartitionSpec::from_entries(std::move(entries));
}

void validate_spec(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape, const char* op,
                   std::string_view argument) {
  std::ostringstream pre;
  pre << "[" << op << "] argument \"" << argument << "\" with shape " << to_string(shape) << ": ";
  const std::string prefix = pre.str();
  check_axes_of_spec(mesh, spec, prefix);
  DISTJAX_CHECK(spec.size() <= static_cast<int>(shape.size()), ShardingError, prefix, "spec ",
                spec.to_string(), " is invalid on mesh ", mesh.describe(), ": it has ", spec.size(),
                " entries but the array has rank ", shape.size());
  for (int d = 0; d < spec.size(); ++d) {
    const auto& axes = spec.entries()[d].axes;
    if (axes.empty()) continue;
    const int n = mesh.axes_size(Axes(axes), op);
    DISTJAX_CHECK(shape[d] % n == 0, ShardingError, prefix, "spec ", spec.to_string(),
                  " is invalid on mesh ", mesh.describe(), ": dimension ", d, " (", shape[d],
                  ") is not divisible by ", axes_with_sizes(mesh, axes));
  }
}

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec)
    : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  check_axes_of_spec(mesh_, spec_, "[NamedSharding] ");
}

void NamedSharding::validate(const Shape& shape, const char* op, std::string_view argument) const {
  validate_spec(mesh_, spec_, shape, op, argument);
}

int NamedSharding::num_shards(int dim) const {
  const auto e = spec_.entry(dim);
  return e.replicated() ? 1 : mesh_.axes_size(Axes(e.axes));
}

int NamedSharding::shard_index(int dim, int device) const {
  const auto e = spec_.entry(dim);
  return e.replicated() ? 0 : mesh_.index_along(device, Axes(e.axes));
}

Shape NamedSharding::shard_shape(const Shape& global) const {
  validate(global, "NamedSharding::shard_shape", "array");
  Shape s = global;
  for (std::size_t d = 0; d < s.size(); ++d)
    s[d] /= num_shards(static_cast<int>(d));
  return s;
}

Shape NamedSharding::global_shape(const Shape& local) const {
  DISTJAX_CHECK(spec_.size() <= static_cast<int>(local.size()), ShardingError,
                "[NamedSharding::global_shape] spec ", spec_.to_string(), " has ", spec_.size(),
                " entries but the local shard ", distjax::to_string(local), " has rank ",
                local.size());
  Shape s = local;
  for (std::size_t d = 0; d < s.size(); ++d)
    s[d] *= num_shards(static_cast<int>(d));
  return s;
}

std::vector<std::pair<std::int64_t, std::int64_t>> NamedSharding::shard_range(const Shape& global,
                                                                              int device) const {
  const Shape local = shard_shape(global);
  std::vector<std::pair<std::int64_t, std::int64_t>> r(global.size());
  for (std::size_t d = 0; d < global.size(); ++d) {
    const std::int64_t begin = shard_index(static_cast<int>(d), device) * local[d];
    r[d] = {begin, begin + local[d]};
  }
  return r;
}

std::vector<std::string> NamedSharding::replicated_axes() const {
  std::vector<std::string> out;
  for (const auto& a : mesh_.axis_names())
    if (!spec_.uses(a)) out.push_back(a);
  return out;
}

std::string NamedSharding::to_string() const {
  return "NamedSharding(mesh=" + mesh_.describe() + ", spec=" + spec_.to_string() + ")";
}

}  // namespace distjax::mesh
