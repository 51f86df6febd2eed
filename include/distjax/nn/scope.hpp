// The module system: a Scope carries the parameter tree, the current path and the
// keys, so one function per layer both creates its parameters (Init) and uses them
// (Apply), as a Flax `nn.Module.__call__` does.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/nn/precision.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::spmd {
class DeviceContext;
}

namespace distjax::nn {

class FsdpPrefetcher;

using tensor::Tensor;
using tensor::TensorTree;

/// The PartitionSpec of each parameter, by path (like nn.Partitioned): what a Scope
/// records at init and what gradient synchronisation reads. An absent path is replicated.
using ParamSpecs = std::map<std::string, mesh::PartitionSpec>;

/// Fully sharded parameters (ZeRO-3 / FSDP), see Scope::fully_sharded.
struct FullySharded {
  std::string axis = "data";
  /// Parameters with fewer elements stay replicated along the axis (the toolkit's 2^18).
  std::int64_t min_weight_size = std::int64_t{1} << 18;
  /// This device's prefetcher (nn/fsdp_gather.hpp), or null: gather each parameter at use.
  FsdpPrefetcher* prefetch = nullptr;
  /// Empty: every parameter under the scope. Otherwise only those of the modules of these
  /// kinds (the toolkit's fsdp.modules: "Block", "Attn", "MLP"; Scope::module); the others
  /// stay as they are. Not with a prefetcher.
  std::vector<std::string> modules{};
};

/// What a forward pass reports beside its output (Flax's `sow`): statistics for the
/// metrics from layers deep in a model (a Mixture-of-Experts layer's balance), and the
/// loads its balancing bias moves by. The caller owns it for one pass and reads it after.
/// (An auxiliary loss joins the objective through the backward pass instead:
/// autodiff::add_loss.)
///
///   nn::Sown sown;
///   Tensor loss = model.loss(scope.sowing(&sown), tokens, targets);
///   for (const auto& [name, values] : sown.metrics) ...
struct Sown {
  /// Named scalar statistics, one value per layer that sowed it (a metric is their mean).
  std::map<std::string, std::vector<Tensor>> metrics;
  /// Per-expert loads (f32 counts of the pairs routed to each expert) by the path of the MoE
  /// layer's balancing bias, summed over the calls of the pass.
  std::map<std::string, std::vector<double>> loads;
};

/// Whether a scope creates parameters or reads them.
enum class Mode { Init, Apply };

/// Where a layer finds (or puts) its parameters and randomness.
///
///   TensorTree params;
///   Scope init = Scope::init(&params, Key::from_seed(0));
///   Dense{.features = 512}(init.child("fc1"), x);        // creates fc1/kernel, fc1/bias
///   Scope run = Scope::apply(&params, /*train=*/true, dropout_key);
///   Tensor y = Dense{.features = 512}(run.child("fc1"), x);
///
/// Parameters are created from `init_key.fold_in(full_path)`, so a layer's values
/// depend only on the key and its path, never on creation order. A scope is a small
/// value; children share the parent's tree.
///
/// Sharded parameters: on a scope bound to a device with `on(ctx)` (inside shard_map),
/// `param(name, global_shape, init, spec)` creates and reads this device's shard of the
/// parameter (local shape = global shape split by `spec` on ctx's mesh), with exactly
/// the values of that slice of the single-device parameter, marked as varying over the
/// axes `spec` names. Layers reach the device's collectives through context(); a scope
/// without a context is one device (every axis has size 1).
///
///   Scope s = Scope::init(&params, key, &specs).on(ctx);
///   Tensor w = s.param("kernel", {784, 512}, lecun_normal(), P(std::nullopt, "model"));
///   // on ("data"=2, "model"=4): w is (784, 128), columns [128 m, 128 m + 128) of the
///   // single-device kernel, m = ctx.axis_index("model")
class Scope {
 public:
  /// A root scope that creates parameters into `*params` (and records the PartitionSpec
  /// of every sharded one into `*specs` when given). Both must outlive the scope.
  static Scope init(TensorTree* params, Key init_key, ParamSpecs* specs = nullptr,
                    bool train = false, Key dropout_key = Key{});
  /// A root scope that reads parameters from `params` (which must outlive it).
  static Scope apply(const TensorTree* params, bool train, Key dropout_key = Key{});

  /// The same scope bound to a device inside shard_map: parameters are this device's
  /// shards and layers run their collectives on `ctx` (which must outlive the scope).
  Scope on(spmd::DeviceContext& ctx) const;
  /// The same scope with its parameters stored fully sharded over `config.axis` (ZeRO-3,
  /// FSDP; only on a scope bound to a device): param() stores each parameter of at least
  /// min_weight_size elements split further along the axis (mesh::fully_sharded_spec),
  /// records that spec, and returns the parameter gathered over the axis (all_gather;
  /// its backward reduce-scatters the gradient as the mean over the axis, as data
  /// parallelism averages), so layers see the same tensor as without. Under
  /// autodiff::checkpoint the gathered parameter lives only while its module runs and is
  /// gathered again in the backward pass (TransformerConfig::remat).
  /// With config.modules, only inside modules of those kinds: see module().
  Scope fully_sharded(FullySharded config) const;
  /// The scope of a module of kind `kind` ("Block", "Attn", "MLP"): this scope, fully
  /// sharded when a fully_sharded configuration above lists that kind in its modules.
  /// Layers call it on the child scope they open (blocks/<i>, attn, mlp).
  Scope module(std::string_view kind) const;
  /// The fully-sharded configuration; null when parameters are not fully sharded.
  const FullySharded* fsdp() const { return fsdp_.get(); }

  /// The same scope with the mixed-precision policy `precision` (nn/precision.hpp),
  /// inherited by its children: layers cast their matmul operands to its compute dtype.
  /// Parameters stay f32 (param_dtype other than f32 is NotImplemented).
  Scope with_precision(Precision precision) const;
  /// The scope's policy (f32 unless with_precision set one).
  const Precision& precision() const { return precision_; }

  /// The device this scope runs on; null for one device without a mesh.
  spmd::DeviceContext* context() const { return ctx_; }
  /// Devices along `axes` (1 without a context); throws ShardingError for an axis not
  /// in the context's mesh.
  int axis_size(const mesh::Axes& axes) const;
  /// This device's index along `axes` (0 without a context).
  int axis_index(const mesh::Axes& axes) const;

  /// The same scope reporting into `*sown` (which must outlive the pass), inherited by its
  /// children: sow_metric and sow_loads add to it. A rebased scope (a checkpoint's
  /// recomputation) reports nothing.
  Scope sowing(Sown* sown) const;
  /// Adds a scalar statistic under `name`; nothing on a scope without a Sown.
  void sow_metric(const std::string& name, const Tensor& value) const;
  /// Adds per-expert loads under `path` (Sown::loads); nothing on a scope without a Sown.
  void sow_loads(const std::string& path, const std::vector<double>& loads) const;
  /// Whether sow_metric and sow_loads report anywhere.
  bool sowing() const { return sown_ != nullptr; }
  /// Where they report; null when nowhere.
  Sown* sown() const { return sown_; }

  /// The nested scope "path/name"; its dropout key is dropout_key().fold_in(name).
  Scope child(const std::string& name) const;
  /// child(std::to_string(index)), for layer lists ("blocks/0", "blocks/1", ...).
  Scope child(int index) const { return child(std::to_string(index)); }

  /// The parameter `name` of this scope (path "path/name"), f32, of global shape `shape`
  /// split by `spec` (empty = replicated). Without a context the whole parameter; with
  /// one, this device's shard, marked as varying over the axes `spec` names.
  /// Init: creates it with init(init_key.fold_in(full path), shape, this device's
  /// block), stores it and records a non-empty `spec` into the specs (if any). Asking
  /// again for an existing path returns the same tensor (a layer applied twice shares
  /// its parameters); a different shape is an error.
  /// Apply: returns the stored leaf; throws InvalidArgument naming the path when it is
  /// missing or its shape differs from the (local) shape expected.
  /// A spec that does not fit the shape on the context's mesh is a ShardingError.
  Tensor param(const std::string& name, const Shape& shape, const Initializer& init,
               const mesh::PartitionSpec& spec = {}) const;

  /// The same scope over another tree rooted at this scope's path (the subtree of
  /// this scope's parameters): used to re-run a block under autodiff::checkpoint.
  /// The result is in Apply mode and keeps path, train flag and keys.
  Scope rebased(const TensorTree* subtree) const;
  /// This scope's parameters, with the path prefix removed (Apply mode).
  TensorTree params() const;

  Mode mode() const { return mode_; }
  bool is_init() const { return mode_ == Mode::Init; }
  bool train() const { return train_; }
  /// "" for the root, else "a/b/c".
  const std::string& path() const { return path_; }
  /// path()/name.
  std::string full_path(const std::string& name) const;
  /// The dropout key of this scope (differs per child name).
  Key dropout_key() const { return dropout_key_; }
  Key init_key() const { return init_key_; }

 private:
  Scope() = default;
  std::string tree_path(const std::string& full) const;

  TensorTree* out_ = nullptr;       // Init: where parameters go
  const TensorTree* in_ = nullptr;  // Apply: where parameters come from
  ParamSpecs* specs_ = nullptr;
  spmd::DeviceContext* ctx_ = nullptr;
  std::shared_ptr<const FullySharded> fsdp_;
  std::shared_ptr<const FullySharded> fsdp_modules_;  // pending: applies inside module()
  // Fully sharded parameters already gathered by this scope tree (a tied embedding is
  // gathered once per pass, not per use); a rebased scope starts its own.
  std::shared_ptr<std::map<std::string, Tensor>> gathered_;
  Precision precision_{};
  Sown* sown_ = nullptr;
  std::string path_;  // logical path of this scope
  std::string root_;  // logical path the tree is rooted at ("" unless rebased)
  Mode mode_ = Mode::Apply;
  Key init_key_{};
  bool train_ = false;
  Key dropout_key_{};
};

/// The parameters `build` creates when it runs a model's forward once on an init scope
/// (no tape): recording the PartitionSpec of every sharded one into `*specs` when given;
/// this device's shards with a device context; stored fully sharded as `fsdp` says when
/// given. What every model's init(key, specs, ctx, fsdp) is.
///
///   return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& s) {
///     (*this)(s, Tensor::zeros({1, in_features}));
///   });
TensorTree init_parameters(Key key, ParamSpecs* specs, spmd::DeviceContext* ctx,
                           const FullySharded* fsdp,
                           const std::function<void(const Scope&)>& build);

}  // namespace distjax::nn
