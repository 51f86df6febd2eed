// Grouping of a multi-tensor op's operands into kernel calls: one per device (and per any
// other trait the kernel needs alike), in the order the operands came.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace distjax::tensor::detail {

/// The indices 0..n-1 grouped by key(i) (keys compared with ==): the groups in the order
/// of their first index, each group's indices ascending.
template <class KeyOf>
std::vector<std::vector<std::size_t>> group_indices(std::size_t n, KeyOf&& key_of) {
  using Key = decltype(key_of(std::size_t{0}));
  std::vector<std::pair<Key, std::vector<std::size_t>>> groups;
  for (std::size_t i = 0; i < n; ++i) {
    Key k = key_of(i);
    auto it = groups.begin();
    while (it != groups.end() && !(it->first == k)) ++it;
    if (it == groups.end()) it = groups.insert(groups.end(), {std::move(k), {}});
    it->second.push_back(i);
  }
  std::vector<std::vector<std::size_t>> out;
  out.reserve(groups.size());
  for (auto& [k, indices] : groups) out.push_back(std::move(indices));
  return out;
}

}  // namespace distjax::tensor::detail
