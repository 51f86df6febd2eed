// The threads backend: simulated devices as threads of this process meeting in shared
// memory, with a fixed reduction order (bit-reproducible results).
#pragma once

#include <memory>

#include "distjax/comm/communicator.hpp"
#include "distjax/comm/threads/group_state.hpp"

namespace distjax::comm::threads {

/// One device's handle on one group of the threads backend.
class ThreadsCommunicator final : public CommunicatorImpl {
 public:
  ThreadsCommunicator(std::shared_ptr<WorldState> world, std::shared_ptr<GroupState> group,
                      int rank, std::shared_ptr<CommStats> stats);

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  int global_rank() const override { return g_->members()[rank_]; }
  const std::vector<int>& group() const override { return g_->members(); }

  void all_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                  ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::int64_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) override;
  void all_to_all(const void* send, void* recv, std::int64_t count, DType dtype) override;
  void broadcast(void* buf, std::int64_t count, DType dtype, int root) override;
  void permute(const void* send, void* recv, std::int64_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs) override;
  void barrier() override;
  Request isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag) override;
  Request irecv(void* buf, std::int64_t count, DType dtype, int src, int tag) override;
  Request iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) override;
  Request iall_gather(const void* send, void* recv, std::int64_t count, DType dtype) override;
  Request ireduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                          ReduceOp op) override;
  std::shared_ptr<CommunicatorImpl> split(int color, int key) override;
  CommStats& stats() override { return *stats_; }

 private:
  class Call;
  Request post(bool is_send, void* buf, std::int64_t count, DType dtype, int peer, int tag);
  // Runs a blocking collective with the link model's time taken out of it and returns a
  // request whose wait() lets that time elapse from the moment of issue (a transfer
  // proceeding in the background).
  template <class F>
  Request deferred(F&& collective);
  // Set while a non-blocking collective runs: Call::depart records the link time here
  // instead of sleeping.
  bool defer_link_ = false;
  double deferred_link_us_ = 0;

  std::shared_ptr<WorldState> world_;
  std::shared_ptr<GroupState> g_;
  int rank_;
  std::shared_ptr<CommStats> stats_;
  std::uint64_t seq_ = 0;
};

}  // namespace distjax::comm::threads
