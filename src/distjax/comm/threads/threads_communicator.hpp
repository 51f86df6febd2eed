// The threads backend: simulated devices as threads of this process meeting in shared
// memory, with a fixed reduction order (bit-reproducible results).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <thread>

#include "distjax/comm/communicator.hpp"
#include "distjax/comm/threads/group_state.hpp"

namespace distjax::comm::threads {

/// One device's handle on one group of the threads backend.
class ThreadsCommunicator final : public CommunicatorImpl {
 public:
  ThreadsCommunicator(std::shared_ptr<WorldState> world, std::shared_ptr<GroupState> group,
                      int rank, std::shared_ptr<CommStats> stats);
  ~ThreadsCommunicator() override;

  // A call that the caller waits on at once (Completion::Now) runs on the calling thread
  // when nothing is in flight on this group (in_order); otherwise it is queued on the
  // group's worker (enqueue).
  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op,
                      Completion completion) override;
  Request iall_gather(const Buffer& send, const Buffer& recv, Completion completion) override;
  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                          Completion completion) override;
  Request iall_to_all(const Buffer& send, const Buffer& recv, Completion completion) override;
  Request iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                       const Buffer& recv, const std::vector<std::int64_t>& recv_counts,
                       Completion completion) override;
  bool has_all_to_allv() const override { return true; }
  Request ibroadcast(const Buffer& buf, int root, Completion completion) override;
  Request ipermute(const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs, Completion completion) override;
  void barrier() override;
  Request isend(const Buffer& buf, int dst, int tag) override;
  Request irecv(const Buffer& buf, int src, int tag) override;
  std::shared_ptr<CommunicatorImpl> split(int color, int key) override;
  void set_link_model(const LinkModel& link) override;

 private:
  struct Mover;
  class Call;
  struct Job;
  class CollectiveRequest;
  Request post(bool is_send, const Buffer& buf, int peer, int tag);

  /// The mover of a call issued now on these buffers (see Mover in the .cpp).
  std::shared_ptr<Mover> mover(const char* op, std::initializer_list<const Buffer*> buffers);

  // The collectives themselves, run on the device's thread or on the worker.
  void run_all_reduce(Mover& m, const Buffer& send, const Buffer& recv, ReduceOp op);
  void run_all_gather(Mover& m, const Buffer& send, const Buffer& recv);
  void run_reduce_scatter(Mover& m, const Buffer& send, const Buffer& recv, ReduceOp op);
  void run_all_to_all(Mover& m, const Buffer& send, const Buffer& recv);
  void run_all_to_allv(Mover& m, const Buffer& send, const std::vector<std::int64_t>& send_counts,
                       const Buffer& recv, const std::vector<std::int64_t>& recv_counts);
  void run_broadcast(Mover& m, const Buffer& buf, int root);
  void run_permute(Mover& m, const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs);
  void run_barrier();
  void run_set_link_model(const LinkModel& link);
  std::shared_ptr<CommunicatorImpl> run_split(int color, int key);

  /// Queues fn (moving data with mover m, or none) on this group's worker (started on
  /// first use) behind the requests in flight; the request completes when fn has run,
  /// and orders the caller's stream after the device work fn queued.
  Request enqueue(std::shared_ptr<Mover> m, std::function<void()> fn);
  /// Runs a blocking collective in issue order: at once when nothing is in flight on
  /// this group, otherwise queued behind the requests in flight, and waited on.
  void in_order(std::shared_ptr<Mover> m, std::function<void()> fn);
  /// A collective issued with `completion`: enqueue for Completion::Later; for
  /// Completion::Now, in_order, returning an empty (complete) request.
  template <class Fn>
  Request issue(Completion completion, std::shared_ptr<Mover> m, Fn&& fn);
  void worker_loop();

  std::shared_ptr<WorldState> world_;
  std::shared_ptr<GroupState> g_;
  std::uint64_t seq_ = 0;

  // Nonblocking collectives: one worker thread per device and group, started by the
  // first i-call; jobs run in issue order. `pending_` counts queued and running jobs:
  // when it is 0 the worker is idle and the device's thread may run calls itself.
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::atomic<int> pending_{0};
  std::thread worker_;
  /// Where the running call of the worker puts its counters (null on the device's thread).
  detail::DeferredCount* defer_ = nullptr;
  Clock::time_point issued_{};  // when the worker's running call was issued
  /// Link model of the worker's running call: it does not sleep but sets this time, when
  /// its data would have arrived (the request's wait sleeps until then); null on the
  /// device's thread, whose blocking calls sleep. `link_free_`: when this group's link is
  /// free again, so calls in flight together take their turns (a FIFO link).
  Clock::time_point* link_ready_ = nullptr;
  Clock::time_point link_free_{};
  /// Charges a call's link time: a sleep on the device's thread, a ready time on the worker.
  void charge_link(const detail::Traffic& traffic);
};

/// Waits for the device work this thread queued on `device` before the thread ends (a
/// thread's GPU stream is torn down with it), quietly: after an error or in a destructor.
void finish_thread_work(Device device);

}  // namespace distjax::comm::threads
