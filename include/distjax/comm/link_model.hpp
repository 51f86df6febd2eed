// LinkModel: the cost model of a simulated interconnect (threads backend).
#pragma once

namespace distjax::comm {

/// Optional cost model of the interconnect for the threads backend: every call sleeps
/// steps * latency + bytes_sent / bandwidth (steps and bytes of the ring algorithm, see
/// OpCounters), so users can see what communication would cost on a slower link. Set at
/// launch (LaunchOptions::link) and changed between steps with
/// Communicator::set_link_model.
struct LinkModel {
  double latency_us = 0;      // per message step
  double bandwidth_gbps = 0;  // GB/s (1e9 bytes per second); 0 = off (memory speed)
  bool enabled() const { return latency_us > 0 || bandwidth_gbps > 0; }
};

}  // namespace distjax::comm
