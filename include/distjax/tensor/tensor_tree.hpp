// TensorTree: named tensors addressed by slash-separated paths ("blocks/0/mlp/fc1/kernel").
// Parameters, gradients and optimizer states are trees with the same paths.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// An ordered map from path to tensor; iteration is in lexicographic path order, so
/// every device and every run visits leaves in the same order.
///
///   TensorTree p;
///   p.set("fc1/kernel", Tensor::zeros({784, 512}));
///   TensorTree fc1 = p.subtree("fc1");   // {"kernel": ...}
class TensorTree {
 public:
  using Map = std::map<std::string, Tensor>;

  void set(const std::string& path, Tensor t) { leaves_[path] = std::move(t); }
  /// The leaf at `path`; throws InvalidArgument listing nearby paths if absent.
  const Tensor& at(const std::string& path) const;
  Tensor& at(const std::string& path);
  bool contains(const std::string& path) const { return leaves_.count(path) != 0; }
  bool erase(const std::string& path) { return leaves_.erase(path) != 0; }
  std::size_t size() const { return leaves_.size(); }
  bool empty() const { return leaves_.empty(); }
  std::vector<std::string> paths() const;

  /// The leaves under `prefix/`, with the prefix removed.
  TensorTree subtree(const std::string& prefix) const;
  /// Inserts every leaf of `other` under `prefix/` (or at top level if prefix is empty).
  void merge(const std::string& prefix, const TensorTree& other);

  /// A tree with the same paths and fn applied to every leaf.
  TensorTree map(const std::function<Tensor(const Tensor&)>& fn) const;
  /// Same, with the path passed too.
  TensorTree map_with_path(
      const std::function<Tensor(const std::string&, const Tensor&)>& fn) const;
  /// Combines two trees with identical paths leaf by leaf; throws if the paths differ.
  TensorTree zip(const TensorTree& other,
                 const std::function<Tensor(const Tensor&, const Tensor&)>& fn) const;
  /// Whether both trees have exactly the same paths and shapes.
  bool same_structure(const TensorTree& other) const;

  /// Total number of elements over all leaves.
  std::int64_t num_elements() const;
  /// Total bytes over all leaves.
  std::int64_t num_bytes() const;
  /// Bytes of memory the leaves keep alive: each distinct storage counted once, whole
  /// (a view of a larger buffer holds all of it).
  std::int64_t storage_bytes() const;

  Map::const_iterator begin() const { return leaves_.begin(); }
  Map::const_iterator end() const { return leaves_.end(); }
  Map::iterator begin() { return leaves_.begin(); }
  Map::iterator end() { return leaves_.end(); }

 private:
  Map leaves_;
};

/// zeros with the same paths, shapes and dtypes.
TensorTree zeros_like(const TensorTree& t);

}  // namespace distjax::tensor
