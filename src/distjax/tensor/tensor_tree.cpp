#include "distjax/tensor/tensor_tree.hpp"

#include <set>

namespace distjax::tensor {

const Tensor& TensorTree::at(const std::string& path) const {
  auto it = leaves_.find(path);
  if (it == leaves_.end()) {
    std::string known;
    int shown = 0;
    for (auto& [p, _] : leaves_) {
      if (shown++ == 12) {
        known += ", ...";
        break;
      }
      known += (known.empty() ? "" : ", ") + p;
    }
    DISTJAX_THROW(InvalidArgument, "[TensorTree::at] no leaf \"", path, "\"; the tree has ",
                  leaves_.size(), " leaves: ", known);
  }
  return it->second;
}

Tensor& TensorTree::at(const std::string& path) {
  return const_cast<Tensor&>(static_cast<const TensorTree&>(*this).at(path));
}

std::vector<std::string> TensorTree::paths() const {
  std::vector<std::string> out;
  out.reserve(leaves_.size());
  for (auto& [p, _] : leaves_) out.push_back(p);
  return out;
}

TensorTree TensorTree::subtree(const std::string& prefix) const {
  TensorTree out;
  const std::string pre = prefix.empty() ? "" : prefix + "/";
  for (auto it = leaves_.lower_bound(pre); it != leaves_.end(); ++it) {
    if (it->first.compare(0, pre.size(), pre) != 0) break;
    out.leaves_.emplace(it->first.substr(pre.size()), it->second);
  }
  return out;
}

void TensorTree::merge(const std::string& prefix, const TensorTree& other) {
  for (auto& [p, t] : other.leaves_) leaves_[prefix.empty() ? p : prefix + "/" + p] = t;
}

TensorTree TensorTree::map(const std::function<Tensor(const Tensor&)>& fn) const {
  TensorTree out;
  for (auto& [p, t] : leaves_) out.leaves_.emplace_hint(out.leaves_.end(), p, fn(t));
  return out;
}

TensorTree TensorTree::map_with_path(
    const std::function<Tensor(const std::string&, const Tensor&)>& fn) const {
  TensorTree out;
  for (auto& [p, t] : leaves_) out.leaves_.emplace_hint(out.leaves_.end(), p, fn(p, t));
  return out;
}

TensorTree TensorTree::zip(const TensorTree& other,
                           const std::function<Tensor(const Tensor&, const Tensor&)>& fn) const {
  DISTJAX_CHECK(leaves_.size() == other.leaves_.size(), InvalidArgument,
                "[TensorTree::zip] trees have ", leaves_.size(), " and ", other.leaves_.size(),
                " leaves");
  TensorTree out;
  auto jt = other.leaves_.begin();
  for (auto it = leaves_.begin(); it != leaves_.end(); ++it, ++jt) {
    DISTJAX_CHECK(it->first == jt->first, InvalidArgument, "[TensorTree::zip] path \"", it->first,
                  "\" meets \"", jt->first, "\"");
    out.leaves_.emplace_hint(out.leaves_.end(), it->first, fn(it->second, jt->second));
  }
  return out;
}

bool TensorTree::same_structure(const TensorTree& other) const {
  if (leaves_.size() != other.leaves_.size()) return false;
  auto jt = other.leaves_.begin();
  for (auto it = leaves_.begin(); it != leaves_.end(); ++it, ++jt)
    if (it->first != jt->first || it->second.shape() != jt->second.shape()) return false;
  return true;
}

std::int64_t TensorTree::num_elements() const {
  std::int64_t n = 0;
  for (auto& [_, t] : leaves_) n += t.numel();
  return n;
}

std::int64_t TensorTree::storage_bytes() const {
  std::set<const Storage*> seen;
  std::int64_t n = 0;
  for (auto& [_, t] : leaves_)
    if (t.defined() && seen.insert(t.storage()).second)
      n += static_cast<std::int64_t>(t.storage()->nbytes());
  return n;
}

std::int64_t TensorTree::num_bytes() const {
  std::int64_t n = 0;
  for (auto& [_, t] : leaves_) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

TensorTree zeros_like(const TensorTree& t) {
  return t.map([](const Tensor& x) { return Tensor::zeros(x.shape(), x.dtype(), x.device()); });
}

}  // namespace distjax::tensor
