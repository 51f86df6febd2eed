// Traffic, link time and the counting of calls (see call_timer.hpp).
#include "distjax/comm/detail/call_timer.hpp"

namespace distjax::comm::detail {

Traffic ring_traffic(OpKind op, std::int64_t b, int p, bool is_root) {
  Traffic t;
  if (p <= 1) return t;
  switch (op) {
    case OpKind::AllReduce:
      t.sent = t.received = 2 * (p - 1) * b / p;
      t.steps = 2 * (p - 1);
      break;
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AllToAll:
      t.sent = t.received = (p - 1) * b;
      t.steps = p - 1;
      break;
    case OpKind::Broadcast:
      t.sent = is_root ? b : 0;
      t.received = is_root ? 0 : b;
      t.steps = 1;
      break;
    case OpKind::Barrier:
    case OpKind::Split:
      t.steps = 1;
      break;
    default:
      break;
  }
  return t;
}

std::chrono::steady_clock::duration link_time(const LinkModel& link, const Traffic& t) {
  if (!link.enabled()) return {};
  double us = t.steps * link.latency_us;
  if (link.bandwidth_gbps > 0) us += static_cast<double>(t.sent) / (link.bandwidth_gbps * 1e3);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::micro>(us));
}

void DeferredCount::apply(CommStats& stats, int group) {
  if (!set) return;
  set = false;
  stats.add(group, kind, delta);
  if (stats.record_spans) stats.spans.push_back(span);
}

CallTimer::CallTimer(CommunicatorImpl& c, OpKind kind, const Traffic& traffic,
                     DeferredCount* defer, std::chrono::steady_clock::time_point start)
    : stats_(defer ? nullptr : &c.stats()),
      defer_(defer),
      // Deferred: spans are always measured (cheap); apply() keeps them if wanted.
      record_spans_(defer ? true : c.stats().record_spans),
      group_(defer ? -1 : c.stats_group()),
      kind_(kind),
      traffic_(traffic),
      start_(start) {}

void CallTimer::arrived() {
  arrived_ = std::chrono::steady_clock::now();
  has_arrived_ = true;
}

CallTimer::~CallTimer() {
  auto end = std::chrono::steady_clock::now();
  if (!has_arrived_) arrived_ = end;
  const OpCounters delta{.calls = 1,
                         .bytes_sent = traffic_.sent,
                         .bytes_received = traffic_.received,
                         .seconds = std::chrono::duration<double>(end - start_).count(),
                         .wait_seconds = std::chrono::duration<double>(arrived_ - start_).count()};
  const CommSpan span{kind_, start_, arrived_, end, traffic_.sent};
  if (defer_) {
    *defer_ = {.set = true, .kind = kind_, .delta = delta, .span = span};
    return;
  }
  stats_->add(group_, kind_, delta);
  if (record_spans_) stats_->spans.push_back(span);
}

void count_post(CommunicatorImpl& c, bool is_send, std::int64_t bytes, bool to_self) {
  const std::int64_t moved = to_self ? 0 : bytes;
  c.stats().add(
      c.stats_group(), is_send ? OpKind::Send : OpKind::Recv,
      {.calls = 1, .bytes_sent = is_send ? moved : 0, .bytes_received = is_send ? 0 : moved});
}

void count_wait(CommStats& stats, int group, bool is_send, double seconds) {
  stats.add(group, is_send ? OpKind::Send : OpKind::Recv,
            {.seconds = seconds, .wait_seconds = seconds});
}

}  // namespace distjax::comm::detail
