// Global-view programs: value_and_grad over a function of GlobalArrays, parameter trees
// placed by sharding rules, and global_map (JAX's jit with in/out shardings) built on
// shard_map.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "distjax/global/global_array.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::global {

/// Parameters of a global-view program, by path.
using GlobalTree = std::map<std::string, GlobalArray>;

/// A loss written for one device: parameters -> scalar loss (any sharding).
using GlobalLossFn = std::function<GlobalArray(const GlobalTree& params)>;

/// Runs `fn` on the tape and returns the loss, replicated (partial sums resolved), and
/// the gradient of every parameter with that parameter's sharding (this device's block
/// of the full gradient). The backward pass runs the transposes of every collective the
/// rules inserted: gradients of parameters replicated along an axis the batch is split
/// over are summed over it (the implicit pvary), those of split parameters stay split.
///
///   auto [loss, grads] = global::value_and_grad([&](const GlobalTree& p) {
///     return mean(cross_entropy(matmul(relu(matmul(x, p.at("w1"))), p.at("w2")), y));
///   }, params);
std::pair<GlobalArray, GlobalTree> value_and_grad(const GlobalLossFn& fn, const GlobalTree& params);

/// The local parameters of this device (shard_map inputs with the specs of `rules`)
/// wrapped as GlobalArrays.
GlobalTree wrap_params(DeviceContext& ctx, const tensor::TensorTree& locals,
                       const parallel::ShardingRules& rules);
/// The local tensors of a GlobalTree.
tensor::TensorTree locals_of(const GlobalTree& tree);

/// fn(ctx, inputs) -> outputs on GlobalArrays.
using GlobalFn =
    std::function<std::vector<GlobalArray>(DeviceContext& ctx, const std::vector<GlobalArray>& in)>;

/// JAX's jit(fn, in_shardings, out_shardings): a shard_map whose function sees its
/// inputs as GlobalArrays with `in_specs` and whose outputs are resharded to `out_specs`
/// (partial sums resolved, replicated axes made invariant) before assembly.
spmd::ShardMapped global_map(Mesh mesh, GlobalFn fn, std::vector<PartitionSpec> in_specs,
                             std::vector<PartitionSpec> out_specs,
                             spmd::ShardMapOptions options = {});

}  // namespace distjax::global
