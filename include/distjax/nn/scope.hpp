// The module system: a Scope carries the parameter tree, the current path and the
// keys, so one function per layer both creates its parameters (Init) and uses them
// (Apply), as a Flax `nn.Module.__call__` does.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::nn {

using tensor::Tensor;
using tensor::TensorTree;

/// Per-dimension mesh-axis names of a parameter ("" = that dimension is not sharded).
/// An empty vector means replicated. The sharding rules of the parallel part read it.
using AxisNames = std::vector<std::string>;
/// Sharding metadata of a parameter tree, by parameter path (like nn.Partitioned).
using Specs = std::map<std::string, AxisNames>;

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
class Scope {
 public:
  /// A root scope that creates parameters into `*params` (and records their
  /// sharding metadata into `*specs` when given). Both must outlive the scope.
  static Scope init(TensorTree* params, Key init_key, Specs* specs = nullptr, bool train = false,
                    Key dropout_key = Key{});
  /// A root scope that reads parameters from `params` (which must outlive it).
  static Scope apply(const TensorTree* params, bool train, Key dropout_key = Key{});

  /// The nested scope "path/name"; its dropout key is dropout_key().fold_in(name).
  Scope child(const std::string& name) const;
  /// child(std::to_string(index)), for layer lists ("blocks/0", "blocks/1", ...).
  Scope child(int index) const { return child(std::to_string(index)); }

  /// The parameter `name` of this scope (path "path/name"), of dtype f32.
  /// Init: creates it with init(init_key.fold_in(full path), shape), stores it and
  /// records `axes` into the specs (if any). Asking again for an existing path returns
  /// the same tensor (a layer applied twice shares its parameters); a different shape
  /// is an error.
  /// Apply: returns the stored leaf; throws InvalidArgument naming the path when it is
  /// missing or its shape differs from `shape`.
  Tensor param(const std::string& name, const Shape& shape, const Initializer& init,
               const AxisNames& axes = {}) const;

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
  Specs* specs_ = nullptr;
  std::string path_;  // logical path of this scope
  std::string root_;  // logical path the tree is rooted at ("" unless rebased)
  Mode mode_ = Mode::Apply;
  Key init_key_{};
  bool train_ = false;
  Key dropout_key_{};
};

}  // namespace distjax::nn
