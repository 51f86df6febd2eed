// Helpers shared by the propagation rules: entries, candidate enumeration, the best pick.
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global::detail {

using Entry = std::vector<std::string>;

inline bool contains(const std::vector<std::string>& v, const std::string& a) {
  return std::find(v.begin(), v.end(), a) != v.end();
}

inline bool distinct(const std::vector<std::string>& v) {
  return std::set<std::string>(v.begin(), v.end()).size() == v.size();
}

inline std::vector<Entry> unique_entries(std::vector<Entry> v) {
  std::vector<Entry> out;
  for (auto& e : v)
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
  return out;
}

/// Calls fn with one entry per dimension for every combination of the options.
inline void for_each_choice(const std::vector<std::vector<Entry>>& opts,
                            const std::function<void(const std::vector<Entry>&)>& fn) {
  std::vector<Entry> pick(opts.size());
  std::function<void(std::size_t)> rec = [&](std::size_t i) {
    if (i == opts.size()) return fn(pick);
    for (const auto& e : opts[i]) {
      pick[i] = e;
      rec(i + 1);
    }
  };
  rec(0);
}

/// Devices the computation is split over: the product of the used axes' sizes.
inline std::int64_t split_devices(const std::vector<std::string>& used, const Mesh& mesh) {
  std::int64_t n = 1;
  for (const auto& a : used)
    n *= mesh.axis_size(a);
  return n;
}

/// Keeps the best rule: the one whose computation is split over the most devices (the
/// product of the axes the inputs already split that the product keeps split: a rule
/// never replicates work the shardings divided), then the fewest bytes, then the first
/// offered. Bytes alone would gather a row-parallel product (an all-gather moves half an
/// all-reduce's bytes) and run it whole on every device.
class Best {
 public:
  void offer(OpRule r, std::int64_t devices) { offer(r, r.bytes, devices); }
  /// `cost`: the bytes to minimise (the rule's own plus what it defers to consumers).
  void offer(OpRule r, std::int64_t cost, std::int64_t devices) {
    if (!rule_ || devices > devices_ || (devices == devices_ && cost < cost_)) {
      rule_ = std::move(r);
      cost_ = cost;
      devices_ = devices;
    }
  }
  OpRule get(const char* op) const {
    DISTJAX_CHECK(rule_.has_value(), ShardingError, "[global::", op,
                  "] no valid sharding for these inputs");
    return *rule_;
  }

 private:
  std::optional<OpRule> rule_;
  std::int64_t cost_ = 0, devices_ = 0;
};

}  // namespace distjax::global::detail
