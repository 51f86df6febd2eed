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

#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/request.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm {

/// Reduction of all_reduce / reduce_scatter. Mean is the sum divided by the group size.
enum class ReduceOp : std::uint8_t { Sum, Mean, Max };
/// "sum", "mean", "max".
const char* reduce_op_name(ReduceOp op);

/// Backend side of a Communicator (one object per device per group). Every virtual
/// method has the contract of the Communicator method of the same name. The label is
/// kept here, once for every backend: backends count each call with
/// stats().add(stats_group(), ...).
class CommunicatorImpl {
 public:
  virtual ~CommunicatorImpl() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int global_rank() const = 0;
  virtual const std::vector<int>& group() const = 0;
  virtual void all_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                          ReduceOp op) = 0;
  virtual void all_gather(const void* send, void* recv, std::int64_t count, DType dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                              ReduceOp op) = 0;
  virtual void all_to_all(const void* send, void* recv, std::int64_t count, DType dtype) = 0;
  /// Non-blocking forms. The default runs the blocking collective now and returns a
  /// completed request (a correct form for backends without progress of their own).
  virtual Request iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                              ReduceOp op) {
    all_reduce(send, recv, count, dtype, op);
    return Request();
  }
  virtual Request iall_gather(const void* send, void* recv, std::int64_t count, DType dtype) {
    all_gather(send, recv, count, dtype);
    return Request();
  }
  virtual Request ireduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                                  ReduceOp op) {
    reduce_scatter(send, recv, count, dtype, op);
    return Request();
  }
  virtual void broadcast(void* buf, std::int64_t count, DType dtype, int root) = 0;
  virtual void permute(const void* send, void* recv, std::int64_t count, DType dtype,
                       const std::vector<std::pair<int, int>>& pairs) = 0;
  virtual void barrier() = 0;
  virtual Request isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag) = 0;
  virtual Request irecv(void* buf, std::int64_t count, DType dtype, int src, int tag) = 0;
  virtual std::shared_ptr<CommunicatorImpl> split(int color, int key) = 0;
  virtual CommStats& stats() = 0;

  /// The label of Communicator::label(), kept here for every backend ("world" at first).
  const std::string& label() const { return label_; }
  /// Communicator::set_label.
  void set_label(std::string_view label) {
    label_ = label;
    group_ = -1;
  }
  /// Index of label() among the groups of stats(), looked up on first use only.
  int stats_group() {
    if (group_ < 0) group_ = stats().group_index(label_);
    return group_;
  }

 private:
  std::string label_ = "world";
  int group_ = -1;
};

/// One device's view of a group of devices. A small value handle (copies share the same
/// group); one per device per group. Not thread-safe: only the device that owns it calls
/// it. `count` is always the number of elements of one rank's block; buffers are raw
/// host memory of `dtype`. Ranks are positions in this group (0..size()-1).
///
/// No silent hangs: every call is recorded in a flight recorder (sequence number, op,
/// count, dtype, group). When the devices of a group disagree at the same sequence number
/// (different op, count, dtype, root, reduce op or permutation) or some device does not
/// arrive within the timeout, EVERY participating device throws CommError with one
/// message naming the op(s) and the devices that differ or are missing, e.g.
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
  /// support f32, i32, i64 and bf16/f16 (accumulated in f32). send == recv is allowed.
  void all_reduce(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op) {
    impl_->all_reduce(send, recv, count, dtype, op);
  }
  /// recv (size()*count elements, rank-major) gets every rank's send block (count).
  void all_gather(const void* send, void* recv, std::int64_t count, DType dtype) {
    impl_->all_gather(send, recv, count, dtype);
  }
  /// send holds size()*count elements (block j = elements [j*count, (j+1)*count)); recv
  /// (count) gets op over ranks of block rank().
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) {
    impl_->reduce_scatter(send, recv, count, dtype, op);
  }
  /// send and recv hold size()*count elements: block j of send goes to rank j; block i of
  /// recv came from rank i.
  void all_to_all(const void* send, void* recv, std::int64_t count, DType dtype) {
    impl_->all_to_all(send, recv, count, dtype);
  }
  /// Non-blocking all_reduce: starts the collective and returns a request; the buffers
  /// belong to it until wait() returns (do not read recv, nor write send, before). Every
  /// rank of the group must issue its collectives, blocking or not, in the same order
  /// (they are matched by issue order per group, as MPI and NCCL do); several may be in
  /// flight and waited on in any order. Counted in stats() like the blocking form.
  /// Threads backend: the data moves at issue (the ranks meet as for the blocking form)
  /// and the link model's transfer time elapses in the background, charged at wait();
  /// MPI: MPI_Iallreduce, polled against the timeout at wait().
  ///
  ///   Request r = comm.iall_reduce(buf, buf, n, DType::F32, ReduceOp::Mean);
  ///   compute_something();   // the transfer proceeds meanwhile
  ///   r.wait();
  Request iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) {
    return impl_->iall_reduce(send, recv, count, dtype, op);
  }
  /// Non-blocking all_gather (the contract of iall_reduce).
  Request iall_gather(const void* send, void* recv, std::int64_t count, DType dtype) {
    return impl_->iall_gather(send, recv, count, dtype);
  }
  /// Non-blocking reduce_scatter (the contract of iall_reduce).
  Request ireduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                          ReduceOp op) {
    return impl_->ireduce_scatter(send, recv, count, dtype, op);
  }
  /// Copies root's buf (count) into every rank's buf.
  void broadcast(void* buf, std::int64_t count, DType dtype, int root) {
    impl_->broadcast(buf, count, dtype, root);
  }
  /// For every (src, dst) pair, rank dst's recv gets rank src's send (count elements);
  /// ranks that receive nothing get zeros. Each rank may appear at most once as src and
  /// once as dst. Every rank must pass the same pairs.
  void permute(const void* send, void* recv, std::int64_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs) {
    impl_->permute(send, recv, count, dtype, pairs);
  }
  /// Returns when every rank of the group has called it.
  void barrier() { impl_->barrier(); }

  /// Starts sending count elements of buf to rank dst with tag (0 <= tag < kMaxTag).
  /// Messages between the same (src, dst, tag) arrive in order. The transfer proceeds
  /// while the caller computes; complete it with Request::wait().
  Request isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag) {
    return impl_->isend(buf, count, dtype, dst, tag);
  }
  /// Starts receiving count elements from rank src with tag into buf.
  Request irecv(void* buf, std::int64_t count, DType dtype, int src, int tag) {
    return impl_->irecv(buf, count, dtype, src, tag);
  }
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
