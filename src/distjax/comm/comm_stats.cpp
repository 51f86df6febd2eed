// OpKind names, the CommStats sums and its counters per group label.
#include "distjax/comm/comm_stats.hpp"

#include <algorithm>
#include <cassert>

namespace distjax::comm {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Permute: return "permute";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
  }
  return "?";
}

std::int64_t CommStats::total_bytes_sent() const {
  std::int64_t s = 0;
  for (const auto& c : by_kind) s += c.bytes_sent;
  return s;
}
std::int64_t CommStats::total_bytes_received() const {
  std::int64_t s = 0;
  for (const auto& c : by_kind) s += c.bytes_received;
  return s;
}
double CommStats::total_seconds() const {
  double s = 0;
  for (const auto& c : by_kind) s += c.seconds;
  return s;
}
double CommStats::total_wait_seconds() const {
  double s = 0;
  for (const auto& c : by_kind) s += c.wait_seconds;
  return s;
}

namespace {
void add_to(OpCounters& c, const OpCounters& d) {
  c.calls += d.calls;
  c.bytes_sent += d.bytes_sent;
  c.bytes_received += d.bytes_received;
  c.seconds += d.seconds;
  c.wait_seconds += d.wait_seconds;
}
}  // namespace

const std::array<OpCounters, kNumOpKinds>* CommStats::for_group(std::string_view label) const {
  for (const auto& g : groups_)
    if (g.label == label) return &g.by_kind;
  return nullptr;
}

OpCounters CommStats::of(std::string_view label, OpKind k) const {
  const auto* g = for_group(label);
  return g ? (*g)[static_cast<int>(k)] : OpCounters{};
}

std::vector<std::string> CommStats::group_labels() const {
  std::vector<std::string> out;
  for (const auto& g : groups_)
    if (std::any_of(g.by_kind.begin(), g.by_kind.end(),
                    [](const OpCounters& c) { return c.calls > 0; }))
      out.push_back(g.label);
  return out;
}

void CommStats::reset() {
  by_kind = {};
  // Groups stay (communicators hold their indices); only their counters go.
  for (auto& g : groups_)
    g.by_kind = {};
  spans.clear();
}

int CommStats::group_index(std::string_view label) {
  for (std::size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].label == label) return static_cast<int>(i);
  groups_.push_back({std::string(label), {}});
  return static_cast<int>(groups_.size()) - 1;
}

void CommStats::add(int group, OpKind k, const OpCounters& delta) {
  assert(group >= 0 && group < static_cast<int>(groups_.size()));
  add_to(by_kind[static_cast<int>(k)], delta);
  add_to(groups_[group].by_kind[static_cast<int>(k)], delta);
}

}  // namespace distjax::comm
