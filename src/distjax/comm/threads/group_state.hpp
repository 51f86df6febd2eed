// Shared memory of the threads backend: the world of simulated devices and one
// GroupState per group, where devices meet for collectives and point-to-point messages.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/detail/call_timer.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::threads {

using Clock = std::chrono::steady_clock;

class GroupState;

/// Everything the devices of one launch share: options, the groups (so a failing device
/// can wake every waiter) and where each device is (for timeout messages).
class WorldState {
 public:
  explicit WorldState(const LaunchOptions& opts);
  int num_devices() const { return n_; }
  const LaunchOptions& options() const { return opts_; }
  /// The link model in force (options().link until set_link changes it).
  LinkModel link() const {
    return {latency_us_.load(std::memory_order_relaxed),
            bandwidth_gbps_.load(std::memory_order_relaxed)};
  }
  /// Called by one device between barriers of the whole world (set_link_model).
  void set_link(const LinkModel& link) {
    latency_us_.store(link.latency_us, std::memory_order_relaxed);
    bandwidth_gbps_.store(link.bandwidth_gbps, std::memory_order_relaxed);
  }

  void register_group(const std::shared_ptr<GroupState>& g);
  /// Fails every group not failed yet with `why` and wakes its waiters.
  void abort_all(const std::string& why);
  /// Device d returned from its program: waiters for it fail instead of timing out.
  void device_exited(int d);
  bool exited(int d) const { return exited_[d].load(std::memory_order_acquire); }

  /// Flight recorder of each device's current call, for messages.
  void enter_call(int d, OpKind op, std::uint64_t seq, std::shared_ptr<const std::string> group);
  void leave_call(int d);
  /// "device 1 is in all_gather call #0 of group (0,1)", "... finished its program", ...
  std::string where_is(int d);

 private:
  struct Slot {
    std::mutex mu;
    bool busy = false;
    OpKind op = OpKind::Barrier;
    std::uint64_t seq = 0;
    std::shared_ptr<const std::string> group;
  };
  int n_;
  LaunchOptions opts_;
  std::atomic<double> latency_us_, bandwidth_gbps_;
  std::mutex mu_;
  std::vector<std::weak_ptr<GroupState>> groups_;
  std::unique_ptr<std::atomic<bool>[]> exited_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

/// One pending or completed point-to-point transfer (one side of it).
struct P2POp {
  bool is_send = false;
  const void* send_buf = nullptr;  // sender's buffer (is_send)
  void* recv_buf = nullptr;        // receiver's buffer (!is_send)
  std::int64_t count = 0;
  DType dtype = DType::F32;
  int peer = 0;  // rank in the group
  int tag = 0;
  Device device;              // where the buffer is: a CUDA device, or the host (cpu)
  tensor::raw::Event ready;   // the poster's work before the post (the copy follows it)
  // The copy (recorded by the copier on its stream): completing either side orders the
  // completing thread's stream after it. Set before `done`.
  std::shared_ptr<tensor::raw::Event> copied;
  // Guarded by the group mutex:
  bool matched = false;  // paired with the other side (the copy may still be running)
  bool done = false;     // copy finished
  std::string error;
  Clock::time_point ready_at{};  // link model: when the data would have arrived
};

/// Where the devices of one group meet. Collectives go through `sync` points: the first
/// one of a call (the arrival) publishes each rank's descriptor and buffers and checks
/// that all ranks called the same thing; later ones separate the phases of the call.
class GroupState {
 public:
  GroupState(std::shared_ptr<WorldState> world, std::vector<int> members);

  int size() const { return n_; }
  const std::vector<int>& members() const { return members_; }
  const std::shared_ptr<const std::string>& label() const { return label_; }
  WorldState& world() { return *world_; }

  /// Waits until every rank reached this sync point (spinning briefly first where every
  /// device has a core, except on a thread that called sleep_when_waiting). With `arrival`, first publishes the
  /// rank's descriptor, buffers and aux values, and the last arriving rank compares the
  /// descriptors. Throws CommError (and fails the group) on mismatch, timeout, a missing
  /// device that finished its program, or when the group has failed.
  ///
  /// `mark` (may be null) marks the rank's device work before this sync point; once every
  /// rank is through, order_after_marks makes the caller's stream wait for every rank's.
  void sync(int rank, const detail::CallDesc* arrival, const void* send, void* recv, int aux0,
            int aux1, Clock::time_point deadline, const tensor::raw::Event* mark = nullptr);
  /// After rank's last sync point: its thread's stream waits (on the device; the host goes
  /// on) for the work every rank marked before it. Each mark must live until every rank
  /// has called this, i.e. until its owner passes the next sync point of the group.
  void order_after_marks(int rank) const;
  /// Where rank records the mark of its next sync point: a ring of two per rank, kept
  /// here rather than in the rank's communicator so that a mark outlives the call and the
  /// communicator. Slot k is recorded again two marks later, after its rank has passed one
  /// more sync point, so every peer has ordered its stream on it.
  tensor::raw::Event& next_mark(int rank) { return own_marks_[rank][marks_made_[rank]++ % 2]; }

  /// Marks the calling thread as one that runs beside its device's compute (the worker of
  /// non-blocking collectives): its sync points sleep at once instead of spinning, which
  /// would take a core from the computation the collective overlaps.
  static void sleep_when_waiting();

  /// Published at the arrival; valid until the rank's next arrival.
  const void* send_of(int r) const { return send_[r]; }
  void* recv_of(int r) const { return recv_[r]; }
  int aux0_of(int r) const { return aux0_[r]; }
  int aux1_of(int r) const { return aux1_[r]; }

  /// Split: the group of color `color` created at call `seq` (created by whichever
  /// member comes first; `members` are global ids in rank order).
  std::shared_ptr<GroupState> take_split(std::uint64_t seq, int color,
                                         const std::vector<int>& members);

  /// Point-to-point matching. `op` is queued or paired (the paired copy is queued here,
  /// outside the lock, on the calling thread's stream after both sides' work before their
  /// posts; the ops are then marked done, with the event that marks the copy) and completed.
  void post(int rank, const std::shared_ptr<P2POp>& op);
  /// Blocks until op is done; throws CommError on timeout, failure or a peer that
  /// finished its program without the matching call.
  void wait(int rank, const std::shared_ptr<P2POp>& op, Clock::time_point deadline);
  bool test(const std::shared_ptr<P2POp>& op);
  /// Removes an unmatched op from the queues, or waits for a matched one to finish.
  void cancel(int rank, const std::shared_ptr<P2POp>& op);

  /// Rank left a call between its arrival and its last sync point (an exception): its
  /// peers waiting in that call's later sync points stop waiting for it once the group
  /// has failed.
  void left_call(int rank);

  /// Fails the group (first reason wins) and wakes everyone.
  void fail(const std::string& why);
  /// Throws CommError if the group has failed.
  void check_alive();

 private:
  void fail_locked(const std::string& why);
  std::string copy_message(P2POp& s, P2POp& r, const std::tuple<int, int, int>& key);
  std::vector<int> missing_locked(int rank) const;
  // Whether a sync point may give up on the group's failure: an arrival may; a later sync
  // point (every rank passed the arrival and is moving data from the others' buffers) only
  // once a rank it waits for left its call, else leaving would free buffers a peer reads.
  bool gives_up_locked(int rank, bool arrival) const;
  std::string missing_message_locked(int rank, const std::vector<int>& missing, bool timeout);

  std::shared_ptr<WorldState> world_;
  std::vector<int> members_;
  std::shared_ptr<const std::string> label_;
  int n_;
  bool spin_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Sync points are lock-free on the fast path: ranks count themselves in on `arrived_`,
  // the last one advances `phase_`; waiters spin briefly, then sleep on cv_ (counted in
  // `sleepers_`, so the last arriver only takes the mutex when someone sleeps).
  std::atomic<int> arrived_{0};
  std::atomic<std::uint64_t> phase_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> failed_atomic_{false};
  bool failed_ = false;  // guarded by mu_, like failure_
  std::string failure_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> entered_;  // sync points entered per rank
  std::vector<bool> left_;                                 // guarded by mu_: left_call
  std::vector<detail::CallDesc> desc_;
  std::vector<const void*> send_;
  std::vector<void*> recv_;
  std::vector<int> aux0_, aux1_;
  // The marks of each rank's sync points, by parity: a rank writes those of sync k + 1
  // while a slower one may still read those of sync k, never those of k - 1.
  std::vector<const tensor::raw::Event*> marks_[2];
  std::vector<std::array<tensor::raw::Event, 2>> own_marks_;  // each rank's, touched by it
  std::vector<std::uint64_t> marks_made_;

  struct PendingSplit {
    std::shared_ptr<GroupState> group;
    int taken = 0;
  };
  std::map<std::pair<std::uint64_t, int>, PendingSplit> splits_;

  using Key = std::tuple<int, int, int>;  // (src rank, dst rank, tag)
  std::map<Key, std::deque<std::shared_ptr<P2POp>>> sends_, recvs_;
};

}  // namespace distjax::comm::threads
