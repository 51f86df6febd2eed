// Communicator: the per-device handle through which simulated devices (threads) or
// processes (MPI) run collectives and point-to-point transfers over one group.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distjax/comm/buffer.hpp"
#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/link_model.hpp"
#include "distjax/comm/reduce_op.hpp"
#include "distjax/comm/request.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm {

/// How the caller of a backend's non-blocking entry completes the call. Later: it keeps
/// the request and may compute while the call proceeds (the front's i-forms). Now: it waits
/// on the request at once (the front's blocking forms are `i*(..., Completion::Now).wait()`),
/// so a backend may instead run the call to its end before returning, on the caller's
/// thread, and return an empty (complete) Request: the threads backend runs it inline when
/// nothing is in flight on the group, the MPI backend's small all-reduce waits on the stack.
enum class Completion : std::uint8_t { Later, Now };

/// Backend side of a Communicator (one object per device per group): one entry per
/// operation, each collective in its non-blocking form, with the contract of the
/// Communicator method of the same name (its blocking twin is the front's
/// `i*(..., Completion::Now).wait()`) and buffers as Buffer (see buffer.hpp for what
/// `count` means per op). The front (Communicator) has checked the arguments: counts >= 0,
/// pointers non-null when count > 0, dtype and reduce op supported, ranks, roots, tags and
/// pairs in range, distinct buffers where required; backends check only what is their own:
/// the devices they reach (a buffer elsewhere is refused with NotImplemented naming the op
/// and the device, before anything moves) and an MPI count over INT_MAX.
/// The group's identity (this device's rank, the members, the counters) is plain data set
/// by the constructor; the label is kept here too, once for every backend: backends count
/// each call with stats().add(stats_group(), ...).
class CommunicatorImpl {
 public:
  /// This device is rank `rank` of the group of world devices `members` (in rank order);
  /// `stats`: its counters, shared by all its communicators.
  CommunicatorImpl(int rank, std::vector<int> members, std::shared_ptr<CommStats> stats);
  CommunicatorImpl(const CommunicatorImpl&) = delete;
  CommunicatorImpl& operator=(const CommunicatorImpl&) = delete;
  virtual ~CommunicatorImpl() = default;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int global_rank() const { return members_[static_cast<std::size_t>(rank_)]; }
  const std::vector<int>& group() const { return members_; }
  CommStats& stats() { return *stats_; }
  /// The counters, for what outlives a call of this handle (a request).
  const std::shared_ptr<CommStats>& shared_stats() const { return stats_; }

  virtual Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op,
                              Completion completion) = 0;
  virtual Request iall_gather(const Buffer& send, const Buffer& recv, Completion completion) = 0;
  virtual Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                                  Completion completion) = 0;
  virtual Request iall_to_all(const Buffer& send, const Buffer& recv, Completion completion) = 0;
  /// Communicator::iall_to_allv (counts checked by the front). A backend that exchanges
  /// variable splits overrides both; the default refuses (NotImplemented) and says so.
  virtual Request iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                               const Buffer& recv, const std::vector<std::int64_t>& recv_counts,
                               Completion completion);
  virtual bool has_all_to_allv() const { return false; }
  virtual Request ibroadcast(const Buffer& buf, int root, Completion completion) = 0;
  virtual Request ipermute(const Buffer& send, const Buffer& recv,
                           const std::vector<std::pair<int, int>>& pairs,
                           Completion completion) = 0;
  virtual Request isend(const Buffer& buf, int dst, int tag) = 0;
  virtual Request irecv(const Buffer& buf, int src, int tag) = 0;
  virtual void barrier() = 0;
  virtual std::shared_ptr<CommunicatorImpl> split(int color, int key) = 0;
  /// Communicator::set_link_model. The default: NotImplemented (no simulated link).
  virtual void set_link_model(const LinkModel& link);

  /// The label of Communicator::label(), kept here for every backend ("world" at first).
  const std::string& label() const { return label_; }
  /// Communicator::set_label (a backend that wraps another passes the label on).
  virtual void set_label(std::string_view label) {
    label_ = label;
    group_ = -1;
  }
  /// Index of label() among the groups of stats(), looked up on first use only.
  int stats_group() {
    if (group_ < 0) group_ = stats().group_index(label_);
    return group_;
  }

 private:
  int rank_;
  std::vector<int> members_;
  std::shared_ptr<CommStats> stats_;
  std::string label_ = "world";
  int group_ = -1;
};

/// One device's view of a group of devices. A small value handle (copies share the same
/// group); one per device per group. Not thread-safe: only the device that owns it calls
/// it. Every operation takes Buffers that carry their device (a tensor's through
/// buffer_of, buffer.hpp); the raw-pointer forms describe host memory (CPU) and `count` is
/// always the number of elements of one rank's block. Where buffers may be: the threads
/// backend moves every device's buffers with that device's kernels (tensor/device_memory.hpp:
/// on a GPU shared by the simulated devices, device to device on each device's stream; the
/// checked device through the same path), and a call's buffers, on every rank, must all be
/// on one GPU or all in host memory (else InvalidArgument on the issuing device, or CommError
/// naming the devices that differ). The MPI backend stages buffers on a device through host
/// memory (page-locked on a GPU; src/distjax/comm/detail/host_staging.hpp). Ranks are
/// positions in this group (0..size()-1). Arguments are checked here, once, before any backend sees them
/// (InvalidArgument / NotImplemented naming the op).
///
/// No silent hangs: every call is recorded in a flight recorder (sequence number, op,
/// count, dtype, group). When the devices of a group disagree at the same sequence number
/// (different op, count, dtype, root, reduce op or permutation) or some device does not
/// arrive within the timeout, EVERY participating device throws CommError with one
/// message naming the op(s) and the devices that differ or are missing (under MPI with
/// LaunchOptions::check_collectives off, only a call that hangs or fails is diagnosed,
/// at its timeout, from the flight records, and a mismatch between all-reduces of at
/// most 1 KiB at once; see launch.hpp), e.g.
///   [all_reduce/all_gather] devices disagree at call #3 of group (0,1,2,3): devices
///   0,2,3 called all_reduce(count=16, f32, sum); device 1 called all_gather(count=16, f32)
///   [all_reduce] timed out after 2000 ms at call #7 of group (0,1,2,3): devices 1,3 did
///   not arrive
/// Once a group has failed, every later call on it throws too. Under MPI, when a device
/// drops out after the descriptor check (it raised at its own deadline in a race, or its
/// program failed), the others give up on the collective already in flight; MPI cannot
/// cancel it, so the buffers of that one call may still be written by MPI afterwards:
/// treat a CommError under MPI as fatal to the launch (see launch()).
///
///   launch({.num_devices = 4}, [](Communicator& world) {
///     std::vector<float> x(8, float(world.rank())), y(8);
///     world.all_reduce(x.data(), y.data(), 8, DType::F32, ReduceOp::Sum);  // y = 0+1+2+3
///     Communicator row = world.split(world.rank() / 2, world.rank());      // {0,1}, {2,3}
///   });
class Communicator {
 public:
  Communicator() = default;
  explicit Communicator(std::shared_ptr<CommunicatorImpl> impl) : impl_(std::move(impl)) {}

  bool valid() const { return impl_ != nullptr; }
  /// Position of this device in the group, 0..size()-1.
  int rank() const { return impl_->rank(); }
  /// Number of devices in the group.
  int size() const { return impl_->size(); }
  /// Device id of this device in the world (launch's device index).
  int global_rank() const { return impl_->global_rank(); }
  /// Global device ids of the group's members, in rank order.
  const std::vector<int>& group() const { return impl_->group(); }

  /// recv[i] = op over ranks of send[i], i < count. Sums are taken in rank order
  /// 0..size()-1 on the threads backend, so results are bit-reproducible. Reductions
  /// support f32, f64, i32, i64 and bf16/f16 (accumulated in f32; under NCCL unless
  /// LaunchOptions::half_reduce_in_f32 is false). send == recv is allowed.
  void all_reduce(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op);
  /// recv (size()*count elements, rank-major) gets every rank's send block (count).
  void all_gather(const void* send, void* recv, std::int64_t count, DType dtype);
  /// send holds size()*count elements (block j = elements [j*count, (j+1)*count)); recv
  /// (count) gets op over ranks of block rank().
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op);

  /// Nonblocking forms of the three above: same arguments, same results once the returned
  /// request completes (Request::wait(), or test() returning true); the buffers must stay
  /// alive and untouched until then. Under MPI they are MPI_Iallreduce, MPI_Iallgather
  /// and MPI_Ireduce_scatter_block (an all-reduce of at most 1 KiB: point-to-point
  /// messages that also carry the per-call check); on the threads backend a per-group
  /// worker of this device runs them in the background. Several may be in flight on one group and be
  /// waited on in any order. Ordering: like every collective (NCCL, MPI), they are
  /// matched across devices by the order in which each device ISSUES them on a group, so
  /// every device must issue the same sequence of collectives (blocking and nonblocking
  /// alike) per group; calls on different groups and point-to-point transfers are not
  /// ordered with them. A blocking collective issued while requests are in flight on the
  /// same group runs after them. The timeout applies to each call from the moment it
  /// starts running (threads) or is waited on (MPI). Counters count each call once, when
  /// it completes (its seconds: from issue to completion). Errors (a mismatch, a
  /// timeout, a failed device) are thrown by wait() or test().
  ///
  ///   Request a = comm.iall_reduce(g1, g1, n1, DType::F32, ReduceOp::Sum);
  ///   Request b = comm.iall_gather(x, xs, n2, DType::F32);
  ///   compute_something();   // both proceed meanwhile
  ///   b.wait();              // any order
  ///   a.wait();
  Request iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op);
  Request iall_gather(const void* send, void* recv, std::int64_t count, DType dtype);
  Request ireduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                          ReduceOp op);

  /// The same calls on Buffer descriptions (what the raw-pointer forms build): counts
  /// are the lengths of the buffers (all_gather: recv.count == size() * send.count;
  /// reduce_scatter: send.count == size() * recv.count).
  void all_reduce(const Buffer& send, const Buffer& recv, ReduceOp op);
  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op);
  void all_gather(const Buffer& send, const Buffer& recv);
  Request iall_gather(const Buffer& send, const Buffer& recv);
  void reduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op);
  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op);

  /// send and recv hold size()*count elements: block j of send goes to rank j; block i of
  /// recv came from rank i.
  void all_to_all(const void* send, void* recv, std::int64_t count, DType dtype);
  /// The same on buffers of size() blocks each (send.count == recv.count).
  void all_to_all(const Buffer& send, const Buffer& recv);
  /// Copies root's buf (count) into every rank's buf.
  void broadcast(void* buf, std::int64_t count, DType dtype, int root);
  void broadcast(const Buffer& buf, int root);
  /// For every (src, dst) pair, rank dst's recv gets rank src's send (count elements);
  /// ranks that receive nothing get zeros. Each rank may appear at most once as src and
  /// once as dst. Every rank must pass the same pairs.
  void permute(const void* send, void* recv, std::int64_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs);
  void permute(const Buffer& send, const Buffer& recv,
               const std::vector<std::pair<int, int>>& pairs);
  /// Nonblocking forms of the three above: same arguments, same results once the returned
  /// request completes, under the rules of iall_reduce (buffers alive and untouched until
  /// then; matched across devices by issue order; errors thrown by wait() or test()).
  /// Under MPI they are MPI_Ialltoall, MPI_Ibcast and a pair of MPI_Irecv / MPI_Isend.
  Request iall_to_all(const void* send, void* recv, std::int64_t count, DType dtype);
  Request iall_to_all(const Buffer& send, const Buffer& recv);
  Request ibroadcast(void* buf, std::int64_t count, DType dtype, int root);
  Request ibroadcast(const Buffer& buf, int root);
  Request ipermute(const void* send, void* recv, std::int64_t count, DType dtype,
                   const std::vector<std::pair<int, int>>& pairs);
  Request ipermute(const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs);

  /// The all-to-all of variable splits (MPI_Alltoallv with packed blocks): send holds
  /// send_counts[j] elements for rank j, blocks in rank order; recv gets recv_counts[i]
  /// elements from rank i, blocks in rank order (send.count and recv.count are the sums).
  /// Rank i's send_counts[j] must equal rank j's recv_counts[i]: where they differ, every
  /// rank throws CommError naming the pair (the threads backend checks every pair; MPI
  /// with LaunchOptions::check_collectives detects a disagreement only as MPI does, by
  /// its own error or a truncated message). Under MPI it is MPI_Ialltoallv; on the threads
  /// backend each rank copies its blocks from the senders' buffers, and the link model
  /// charges the bytes that cross between devices, not a padded block. Counted as an
  /// all_to_all in stats(). Backends without it (NCCL, for now): NotImplemented; ask
  /// has_all_to_allv() first (spmd::ragged_all_to_all pads to a block there).
  void all_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                   const Buffer& recv, const std::vector<std::int64_t>& recv_counts);
  Request iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                       const Buffer& recv, const std::vector<std::int64_t>& recv_counts);
  /// Whether this backend exchanges variable splits (threads and MPI: yes; NCCL: not yet).
  bool has_all_to_allv() const { return impl_->has_all_to_allv(); }
  /// Returns when every rank of the group has called it.
  void barrier() { impl_->barrier(); }
  /// Threads backend: the link model (LaunchOptions::link) of every call issued after it
  /// returns, on every device of the launch. Collective over the world communicator:
  /// every device calls it with the same model (else CommError naming the devices), with
  /// no non-blocking call in flight that it has not waited for; it returns on every device
  /// once the new model is in force. Lets one launch measure the same program on two links
  /// step by step. Other backends (a real interconnect): NotImplemented.
  void set_link_model(const LinkModel& link) { impl_->set_link_model(link); }

  /// Starts sending count elements of buf to rank dst with tag (0 <= tag < kMaxTag).
  /// Messages between the same (src, dst, tag) arrive in order. The transfer proceeds
  /// while the caller computes; complete it with Request::wait().
  Request isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag);
  Request isend(const Buffer& buf, int dst, int tag);
  /// Starts receiving count elements from rank src with tag into buf.
  Request irecv(void* buf, std::int64_t count, DType dtype, int src, int tag);
  Request irecv(const Buffer& buf, int src, int tag);
  /// Collective over this group: a new group of the ranks that passed the same color
  /// (>= 0), ordered by key then by rank (like MPI_Comm_split).
  /// The new group counts its calls under this group's label() until given its own.
  Communicator split(int color, int key) const {
    Communicator sub(impl_->split(color, key));
    sub.set_label(label());
    return sub;
  }

  /// Counters of this device (shared by all its communicators).
  CommStats& stats() { return impl_->stats(); }
  /// The label under which this group's calls are counted in stats() (CommStats::of,
  /// CommStats::for_group): "world" for the communicator launch() gives, the parent's
  /// label for a split, the group's mesh axes ("model", "data,model") for those of a
  /// spmd::DeviceContext. Calls count under the label in force when they start.
  const std::string& label() const { return impl_->label(); }
  /// Relabels this group on this device (every copy of the handle shares it). Choosing
  /// labels is the caller's business: groups with equal labels add up.
  void set_label(std::string_view label) { impl_->set_label(label); }

  CommunicatorImpl& impl() { return *impl_; }

 private:
  std::shared_ptr<CommunicatorImpl> impl_;
};

/// User tags of isend/irecv must lie in [0, kMaxTag).
inline constexpr int kMaxTag = 30000;

}  // namespace distjax::comm
