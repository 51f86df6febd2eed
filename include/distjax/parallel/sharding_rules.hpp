// Sharding rules by parameter path (the blog guide's shard_param), a table of what each
// device holds, and a lint that rejects the guide's two pitfalls: weights split over a
// data axis under plain data parallelism, and mesh axes along which devices do the same
// work.
#pragma once

#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "distjax/core/shape.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/mesh/sharded_array.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::parallel {

/// Parameters whose path matches `pattern` (std::regex, ECMAScript, searched anywhere in
/// the path) get `spec`.
struct ShardingRule {
  std::string pattern;
  mesh::PartitionSpec spec;
};

/// Ordered rules from parameter paths to PartitionSpecs: the first rule whose pattern
/// matches wins; a path no rule matches is replicated.
///
///   ShardingRules rules({{"attn/qkv/kernel$", P(std::nullopt, "model")},
///                        {"attn/out/kernel$", P("model", std::nullopt)},
///                        {"embedding$",       P("model", std::nullopt)}});
///   nn::ParamSpecs specs = rules.specs_for(params, mesh);   // validated on the mesh
///   auto placed = place_params(params, rules, mesh);         // ShardedArrays, by path
class ShardingRules {
 public:
  /// Throws InvalidArgument naming a pattern that is not a valid regular expression.
  explicit ShardingRules(std::vector<ShardingRule> rules);

  /// The spec of `path`: the first matching rule's, or P() (replicated).
  mesh::PartitionSpec spec_for(const std::string& path) const;
  /// Index of the rule that decides `path`, or -1 when none matches.
  int rule_for(const std::string& path) const;
  /// The spec of every leaf of `params` (global shapes) that a rule shards, each
  /// validated against its shape on `mesh`: a ShardingError names the rule, the path,
  /// the shape, the spec and the mesh.
  nn::ParamSpecs specs_for(const tensor::TensorTree& params, const mesh::Mesh& mesh) const;

  const std::vector<ShardingRule>& rules() const { return rules_; }

 private:
  std::vector<ShardingRule> rules_;
  std::vector<std::regex> compiled_;
};

/// Places every leaf of `params` (whole, global) on `mesh` with its rule's spec
/// (mesh::device_put): the blog's shard_param over a tree. The result, by path, feeds
/// shard_map with those specs as in_specs.
std::map<std::string, mesh::ShardedArray> place_params(const tensor::TensorTree& params,
                                                       const ShardingRules& rules,
                                                       const mesh::Mesh& mesh);

/// A table with one row per parameter: path, global shape, spec, local shape and bytes
/// per device, and a total line (bytes per device against the replicated total).
/// `shapes`: global shapes by path; `specs`: absent paths are replicated.
std::string sharding_table(const std::map<std::string, Shape>& shapes, const nn::ParamSpecs& specs,
                           const mesh::Mesh& mesh, std::int64_t bytes_per_element = 4);
/// The global shapes of a tree's leaves (for sharding_table and lint_sharding).
std::map<std::string, Shape> global_shapes(const tensor::TensorTree& params);

/// What a run does with its mesh, for lint_sharding.
struct ShardingPlan {
  /// The axes the batch is split over (the data axes of DataParallel).
  mesh::Axes data_axes{};
  /// Data axes over which parameters are stored fully sharded (ZeRO-3 / FSDP / a
  /// ZeroDataParallel-free Scope::fully_sharded): splitting a weight over these is meant.
  mesh::Axes fully_sharded_axes{};
  /// Axes the activations are split over besides the batch (sequence parallelism...).
  mesh::Axes activation_axes{};
  /// Axes the layers are split over into pipeline stages (each stage's parameters are its
  /// own tensors, so no spec names these).
  mesh::Axes pipeline_axes{};
  /// Data axes over which Mixture-of-Experts layers split their experts (expert
  /// parallelism, nn::MoE): the tokens travel to the device holding their expert, so an
  /// expert's slice sees every token routed to it and splitting a weight over these is meant.
  mesh::Axes expert_axes{};
};

/// One finding of lint_sharding.
struct LintFinding {
  enum class Severity { Warning, Error };
  Severity severity = Severity::Error;
  std::string message;
};

/// Checks specs against the guide's two pitfalls, with a message that says what to change
/// (and, first, that every axis a spec or the plan names is an axis of the mesh: a
/// misspelled name, P("modle"), is an Error naming it and the mesh's axes):
///  - a parameter split over a data axis that is neither fully sharded nor an expert axis:
///    under plain data
///    parallelism each replica holds a different slice and trains it as if it were the
///    whole parameter (replicas silently train different models) -> Error;
///  - a mesh axis of size > 1 that splits neither the batch, nor any parameter, nor the
///    activations: the devices along it compute the same thing (redundant compute)
///    -> Error.
std::vector<LintFinding> lint_sharding(const nn::ParamSpecs& specs, const mesh::Mesh& mesh,
                                       const ShardingPlan& plan);
/// lint_sharding that throws ShardingError listing every Error (Warnings are ignored).
void check_sharding(const nn::ParamSpecs& specs, const mesh::Mesh& mesh, const ShardingPlan& plan);

}  // namespace distjax::parallel
