#include "distjax/parallel/sharding_rules.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "distjax/core/error.hpp"
#include "distjax/mesh/named_sharding.hpp"

namespace distjax::parallel {

namespace {

bool contains(const mesh::Axes& axes, const std::string& a) {
  return std::find(axes.names.begin(), axes.names.end(), a) != axes.names.end();
}

std::string mesh_axis(const mesh::Mesh& mesh, const std::string& a) {
  return "\"" + a + "\" (" + std::to_string(mesh.axis_size(a)) + " devices)";
}

// "data", "model", "pipe"
std::string axes_list(const mesh::Mesh& mesh) {
  std::string out;
  for (const auto& a : mesh.axis_names())
    out += (out.empty() ? "\"" : ", \"") + a + "\"";
  return out;
}

}  // namespace

ShardingRules::ShardingRules(std::vector<ShardingRule> rules) : rules_(std::move(rules)) {
  for (const auto& r : rules_) {
    try {
      compiled_.emplace_back(r.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      DISTJAX_THROW(InvalidArgument, "[ShardingRules] pattern \"", r.pattern,
                    "\" is not a valid regular expression: ", e.what());
    }
  }
}

int ShardingRules::rule_for(const std::string& path) const {
  for (std::size_t i = 0; i < compiled_.size(); ++i)
    if (std::regex_search(path, compiled_[i])) return static_cast<int>(i);
  return -1;
}

mesh::PartitionSpec ShardingRules::spec_for(const std::string& path) const {
  const int i = rule_for(path);
  return i < 0 ? mesh::PartitionSpec() : rules_[static_cast<std::size_t>(i)].spec;
}

nn::ParamSpecs ShardingRules::specs_for(const tensor::TensorTree& params,
                                        const mesh::Mesh& mesh) const {
  nn::ParamSpecs out;
  for (const auto& [path, t] : params) {
    const int i = rule_for(path);
    if (i < 0 || rules_[static_cast<std::size_t>(i)].spec.size() == 0) continue;
    const ShardingRule& rule = rules_[static_cast<std::size_t>(i)];
    try {
      mesh::validate_spec(mesh, rule.spec, t.shape(), "ShardingRules", path);
    } catch (const ShardingError& e) {
      DISTJAX_THROW(ShardingError, "[ShardingRules] rule ", i, " (\"", rule.pattern, "\" -> ",
                    rule.spec.to_string(), ") does not fit parameter \"", path, "\": ", e.what());
    }
    out[path] = rule.spec;
  }
  return out;
}

std::map<std::string, mesh::ShardedArray> place_params(const tensor::TensorTree& params,
                                                       const ShardingRules& rules,
                                                       const mesh::Mesh& mesh) {
  const nn::ParamSpecs specs = rules.specs_for(params, mesh);
  std::map<std::string, mesh::ShardedArray> out;
  for (const auto& [path, t] : params) {
    auto it = specs.find(path);
    const mesh::PartitionSpec spec = it == specs.end() ? mesh::PartitionSpec() : it->second;
    out.emplace(path, mesh::device_put(t, mesh::NamedSharding(mesh, spec), path));
  }
  return out;
}

std::map<std::string, Shape> global_shapes(const tensor::TensorTree& params) {
  std::map<std::string, Shape> out;
  for (const auto& [path, t] : params)
    out[path] = t.shape();
  return out;
}

std::string sharding_table(const std::map<std::string, Shape>& shapes, const nn::ParamSpecs& specs,
                           const mesh::Mesh& mesh, std::int64_t bytes_per_element) {
  struct Row {
    std::string path, global, spec, local, bytes;
  };
  std::vector<Row> rows{{"parameter", "global shape", "spec", "on each device", "bytes"}};
  std::int64_t total_local = 0, total_global = 0;
  for (const auto& [path, shape] : shapes) {
    auto it = specs.find(path);
    const mesh::PartitionSpec spec = it == specs.end() ? mesh::PartitionSpec() : it->second;
    const Shape local = mesh::NamedSharding(mesh, spec).shard_shape(shape);
    const std::int64_t bytes = numel(local) * bytes_per_element;
    total_local += bytes;
    total_global += numel(shape) * bytes_per_element;
    rows.push_back(
        {path, to_string(shape), spec.to_string(), to_string(local), std::to_string(bytes)});
  }
  rows.push_back({"total", "", "", "", std::to_string(total_local)});
  std::size_t w[5] = {0, 0, 0, 0, 0};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.path.size());
    w[1] = std::max(w[1], r.global.size());
    w[2] = std::max(w[2], r.spec.size());
    w[3] = std::max(w[3], r.local.size());
    w[4] = std::max(w[4], r.bytes.size());
  }
  std::ostringstream os;
  for (const auto& r : rows) {
    os << r.path << std::string(w[0] - r.path.size() + 2, ' ') << r.global
       << std::string(w[1] - r.global.size() + 2, ' ') << r.spec
       << std::string(w[2] - r.spec.size() + 2, ' ') << r.local
       << std::string(w[3] - r.local.size() + 2, ' ') << std::string(w[4] - r.bytes.size(), ' ')
       << r.bytes << '\n';
  }
  char ratio[64];
  std::snprintf(ratio, sizeof ratio, "%.1f%%",
                total_global > 0 ? 100.0 * static_cast<double>(total_local) / total_global : 0.0);
  os << "bytes per device: " << total_local << " of " << total_global << " replicated (" << ratio
     << ") on mesh " << mesh.describe() << '\n';
  return os.str();
}

std::vector<LintFinding> lint_sharding(const nn::ParamSpecs& specs, const mesh::Mesh& mesh,
                                       const ShardingPlan& plan) {
  std::vector<LintFinding> out;
  for (const mesh::Axes* axes :
       {&plan.data_axes, &plan.fully_sharded_axes, &plan.activation_axes, &plan.pipeline_axes,
        &plan.expert_axes})
    for (const auto& a : axes->names)
      mesh.axis_size(a, "lint_sharding");
  // A spec naming an axis the mesh lacks (a typo such as "modle") would be placed as if
  // replicated by some paths and refused by others: report it before anything runs.
  for (const auto& [path, spec] : specs)
    for (const auto& a : spec.used_axes())
      if (!mesh.has_axis(a))
        out.push_back({LintFinding::Severity::Error,
                       "[lint_sharding] parameter \"" + path + "\" has spec " + spec.to_string() +
                           ", which names axis \"" + a + "\", not an axis of mesh " +
                           mesh.describe() + " (axes " + axes_list(mesh) + ")"});
  for (const auto& a : plan.fully_sharded_axes.names) {
    DISTJAX_CHECK(contains(plan.data_axes, a), InvalidArgument,
                  "[lint_sharding] fully sharded axis \"", a, "\" is not one of the data axes ",
                  plan.data_axes.str());
  }
  // Pitfall 1: a weight split over a data axis that is not fully sharded.
  for (const auto& [path, spec] : specs) {
    for (const auto& a : spec.used_axes()) {
      if (!contains(plan.data_axes, a) || contains(plan.fully_sharded_axes, a) ||
          contains(plan.expert_axes, a))
        continue;
      out.push_back({LintFinding::Severity::Error,
                     "[lint_sharding] parameter \"" + path + "\" is split over data axis " +
                         mesh_axis(mesh, a) + " (spec " + spec.to_string() +
                         ") under plain data parallelism: each replica holds a different "
                         "slice and trains it as if it were the whole parameter, so the "
                         "replicas silently train different models. Store it fully sharded "
                         "over \"" +
                         a + "\" (nn::Scope::fully_sharded, ZeRO-3), or remove \"" + a +
                         "\" from its spec."});
    }
  }
  // Pitfall 2: an axis along which the devices do the same work.
  for (const auto& a : mesh.axis_names()) {
    if (mesh.axis_size(a) == 1 || contains(plan.data_axes, a) ||
        contains(plan.activation_axes, a) || contains(plan.pipeline_axes, a))
      continue;
    bool used = false;
    for (const auto& [path, spec] : specs)
      used |= spec.uses(a);
    if (used) continue;
    out.push_back({LintFinding::Severity::Error,
                   "[lint_sharding] mesh axis " + mesh_axis(mesh, a) +
                       " splits neither the batch (data axes " + plan.data_axes.str() +
                       "), nor any parameter, nor the activations: the devices along it "
                       "compute the same thing (redundant compute). Split the batch over it "
                       "(add it to the data axes), use it for tensor parallelism (shard "
                       "parameters over it), or drop it from the mesh."});
  }
  return out;
}

void check_sharding(const nn::ParamSpecs& specs, const mesh::Mesh& mesh, const ShardingPlan& plan) {
  std::string errors;
  for (const LintFinding& f : lint_sharding(specs, mesh, plan))
    if (f.severity == LintFinding::Severity::Error) errors += "\n  " + f.message;
  DISTJAX_CHECK(errors.empty(), ShardingError, "[check_sharding] the sharding on mesh ",
                mesh.describe(), " has problems:", errors);
}

}  // namespace distjax::parallel
