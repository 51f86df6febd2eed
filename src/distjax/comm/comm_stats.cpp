// OpKind names and the CommStats sums.
#include "distjax/comm/comm_stats.hpp"


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
void CommStats::reset() {
  by_kind = {};
  spans.clear();
}

}  // namespace distjax::comm
