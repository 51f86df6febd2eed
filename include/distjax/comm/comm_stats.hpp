// Per-device communication counters: bytes and calls per collective kind, in total and per
// group label (mesh axes), time spent communicating and waiting for peers, and (optionally)
// a timeline of spans.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace distjax::comm {

/// What a communicator call does; used by the flight recorder, stats and messages.
enum class OpKind : std::uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Permute,
  Barrier,
  Split,
  Send,
  Recv,
};
inline constexpr int kNumOpKinds = 10;

/// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "permute",
/// "barrier", "split", "send", "recv".
const char* op_kind_name(OpKind k);

/// Counters of one kind of call on one device.
struct OpCounters {
  std::int64_t calls = 0;
  /// Bytes this device sends / receives under the bandwidth-optimal (ring) algorithm, the
  /// figure the ZeRO and Megatron papers count, whatever the backend really does. With
  /// p = group size and B = bytes of one rank's block:
  ///   all_reduce 2(p-1)/p * B each way; all_gather, reduce_scatter, all_to_all (p-1) * B
  ///   each way; broadcast: root sends B, every other rank receives B; permute and
  ///   send/recv: the bytes actually moved to / from another device.
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  /// Wall time inside the call (seconds), including waiting for peers.
  double seconds = 0;
  /// Part of `seconds` spent waiting for the other devices to arrive (idle time).
  double wait_seconds = 0;
};

/// One communicator call on the timeline of a device (only kept when record_spans).
struct CommSpan {
  OpKind kind;
  std::chrono::steady_clock::time_point start;    // call entered
  std::chrono::steady_clock::time_point arrived;  // every peer had arrived (wait ends)
  std::chrono::steady_clock::time_point end;      // call returned
  std::int64_t bytes = 0;                         // bytes sent by this device
};

/// Counters of one device, shared by every communicator (world and sub-groups) of that
/// device. Not thread-safe: only the device's own thread updates and reads it.
///
/// Every call is counted twice: in the totals (`by_kind`, `operator[]`) and under the
/// label of the communicator it ran on (Communicator::label()), so the totals always
/// equal the sum over the groups. Labels: "world" for the communicator launch() gives a
/// device; a communicator split from another counts under its parent's label until it is
/// given its own (Communicator::set_label); inside shard_map the mesh axes of the group
/// in mesh order, joined by ',' ("model", "data", "data,model", "" for the group of one
/// device), see spmd::DeviceContext::comm_label(). Point-to-point transfers (isend/irecv,
/// hence spmd::ppermute_start/done) count under the group they use.
///
///   ctx.comm_stats().of("model", OpKind::AllReduce).bytes_sent;  // over "model" only
///   ctx.comm_stats()[OpKind::AllReduce].bytes_sent;              // over every group
class CommStats {
 public:
  /// Totals over every group, by kind.
  std::array<OpCounters, kNumOpKinds> by_kind{};
  /// When true, every call appends a CommSpan to `spans` (for Chrome-trace timelines).
  bool record_spans = false;
  std::vector<CommSpan> spans;

  OpCounters& operator[](OpKind k) { return by_kind[static_cast<int>(k)]; }
  const OpCounters& operator[](OpKind k) const { return by_kind[static_cast<int>(k)]; }
  /// Sums over all kinds.
  std::int64_t total_bytes_sent() const;
  std::int64_t total_bytes_received() const;
  double total_seconds() const;
  double total_wait_seconds() const;

  /// Counters of the group labelled `label` by kind, or nullptr when no communicator of
  /// this device has had that label since it was created.
  const std::array<OpCounters, kNumOpKinds>* for_group(std::string_view label) const;
  /// Counters of one kind under one label; zeros for a label never used.
  OpCounters of(std::string_view label, OpKind k) const;
  /// The labels under which at least one call was counted since creation or reset(), in
  /// order of first use.
  std::vector<std::string> group_labels() const;

  /// Zeroes every counter (totals and per group) and drops the spans (keeps record_spans).
  void reset();

  /// For the backends: the index of `label` (added on first use), as a communicator
  /// keeps it so that counting costs one index lookup.
  int group_index(std::string_view label);
  /// For the backends: adds `delta` to the totals of kind `k` and to those of group
  /// `group` (an index from group_index()).
  void add(int group, OpKind k, const OpCounters& delta);

 private:
  struct Group {
    std::string label;
    std::array<OpCounters, kNumOpKinds> by_kind{};
  };
  std::vector<Group> groups_;
};

}  // namespace distjax::comm
