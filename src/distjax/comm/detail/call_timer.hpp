// What a call costs and how it is counted: its traffic under the ring algorithm, the link
// model's time for it, and the timers and counts that add it to the device's CommStats.
#pragma once

#include <chrono>
#include <cstdint>

#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/communicator.hpp"
#include "distjax/comm/link_model.hpp"

namespace distjax::comm::detail {

/// Bytes sent (= received) by one device under the ring algorithm (see OpCounters), and
/// the number of message steps, for the link model and stats.
struct Traffic {
  std::int64_t sent = 0;
  std::int64_t received = 0;
  int steps = 0;
};
Traffic ring_traffic(OpKind op, std::int64_t block_bytes, int size, bool is_root = false);

/// What the link model charges for this traffic: steps x latency + bytes sent /
/// bandwidth (zero when it is off).
std::chrono::steady_clock::duration link_time(const LinkModel& link, const Traffic& t);

/// The counters of one call measured away from the device's thread (a nonblocking
/// collective run by a worker), added to its CommStats by the device's thread when the
/// call completes, so that CommStats stays single-threaded.
struct DeferredCount {
  bool set = false;
  OpKind kind = OpKind::Barrier;
  OpCounters delta;
  CommSpan span{};
  /// Adds the counters (if set) to `stats` under group index `group`, once.
  void apply(CommStats& stats, int group);
};

/// Measures one call of `c` for its CommStats, in the totals and under c's label: wall
/// time, wait time, bytes, optional span. With `defer`, the figures go there instead and
/// stats are not touched (the caller applies them on the device's thread).
class CallTimer {
 public:
  CallTimer(CommunicatorImpl& c, OpKind kind, const Traffic& traffic,
            DeferredCount* defer = nullptr,
            std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  /// Every peer has arrived: what came before was waiting.
  void arrived();
  ~CallTimer();

 private:
  CommStats* stats_;
  DeferredCount* defer_;
  bool record_spans_;
  int group_;
  OpKind kind_;
  Traffic traffic_;
  std::chrono::steady_clock::time_point start_, arrived_;
  bool has_arrived_ = false;
};

/// Counts an isend / irecv of `c` when it is posted: one call, and its bytes unless the
/// peer is this rank itself.
void count_post(CommunicatorImpl& c, bool is_send, std::int64_t bytes, bool to_self);
/// Counts the wait of a transfer posted under group index `group`: all of it is waiting.
void count_wait(CommStats& stats, int group, bool is_send, double seconds);

}  // namespace distjax::comm::detail
