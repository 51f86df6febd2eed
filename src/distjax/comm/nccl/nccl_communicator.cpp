// The NCCL backend's communicator (see nccl_communicator.hpp and docs/nccl.md).
//
// Ordering: every call records an event on the caller's compute stream
// (cudaStreamPerThread of the device's thread), makes the group's communication stream
// wait on it, issues NCCL on the communication stream and records a done event there.
// Request::wait polls that event (and ncclCommGetAsyncError) against the timeout, then
// makes the compute stream wait on it; a blocking call is its non-blocking form waited on.
// At the timeout the NCCL communicator is aborted (ncclCommAbort: its kernels stop), the
// group fails, and the message names the op, the call and what the other devices called
// (their flight records, exchanged over the host communicator when there is one).
//
// Point-to-point: NCCL matches a send with the peer's receive by order, not by tag, and a
// lone ncclSend blocks its stream until the peer's ncclRecv runs. So isend / irecv are
// queued and issued together, as one ncclGroupStart / ncclGroupEnd, when the device next
// waits on or tests any transfer of the group or issues a collective on it: a ring's or a
// pipeline stage's send and receive then progress together and cannot deadlock.
#include "distjax/comm/nccl/nccl_communicator.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/detail/call_timer.hpp"
#include "distjax/comm/detail/nccl_bootstrap.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda_runtime.hpp"
#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::nccl {

using Clock = std::chrono::steady_clock;
using detail::CallDesc;

namespace {

[[noreturn]] void raise_nccl(ncclResult_t r, const char* op, const char* call, int device,
                             ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  DISTJAX_THROW(CommError, "[", op, "] ", call, " failed on cuda:", device, ": ",
                ncclGetErrorString(r), last != nullptr && *last != '\0' ? " (" : "",
                last != nullptr ? last : "", last != nullptr && *last != '\0' ? ")" : "");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::F64:
      return ncclFloat64;
  }
  DISTJAX_THROW(InvalidArgument, "[nccl] unknown dtype code ", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Mean:
      return ncclAvg;  // NCCL >= 2.10: the sum divided by the group size, every dtype
    case ReduceOp::Max:
      return ncclMax;
  }
  DISTJAX_THROW(InvalidArgument, "[nccl] unknown reduce op ", static_cast<int>(op));
}

bool is_half(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

// Spin briefly, then sleep, backing off to 1 ms: a wait of seconds costs little CPU.
class Backoff {
 public:
  void pause() {
    if (++spins_ < 64) return std::this_thread::yield();
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{20};
};

// A CUDA event without timing, destroyed with its last owner.
using Event = std::shared_ptr<CUevent_st>;
Event make_event(const char* op) {
  cudaEvent_t e = nullptr;
  DISTJAX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), op);
  return Event(e, [](cudaEvent_t x) { cudaEventDestroy(x); });
}
Event record(cudaStream_t s, const char* op) {
  Event e = make_event(op);
  DISTJAX_CUDA_CHECK(cudaEventRecord(e.get(), s), op);
  return e;
}

}  // namespace

void nccl_config(ncclConfig_t& config) {
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
}

void nccl_settle(ncclComm_t comm, ncclResult_t r, const char* op, const char* call, int device,
                 Clock::time_point deadline) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline)
      DISTJAX_THROW(CommError, "[", op, "] ", call, " did not complete on cuda:", device,
                    " before the timeout (the other processes did not join it?)");
    backoff.pause();
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) raise_nccl(r, op, call, device, comm);
}

namespace {

// One queued point-to-point transfer and the state its request shares with the queue.
struct P2pState {
  Event done;              // set when the transfer's group is issued
  bool cancelled = false;  // its request was destroyed before it was issued
};
struct P2pOp {
  bool is_send = false;
  Buffer buf;
  int peer = 0;  // group rank
  int tag = 0;
  Event ready;  // the compute stream when it was posted
  std::shared_ptr<P2pState> state;
};

// What the handles and the requests of one NCCL communicator share.
class Group {
 public:
  Group(ncclComm_t comm, int rank, std::vector<int> members, Communicator host,
        const NcclSettings& s, std::shared_ptr<CommStats> stats)
      : comm_(comm),
        rank_(rank),
        members_(std::move(members)),
        label_(detail::group_label(members_)),
        host_(std::move(host)),
        settings_(s),
        stats_(std::move(stats)) {
    const tensor::cuda::DeviceGuard on(s.device, "nccl");
    DISTJAX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "nccl");
    DISTJAX_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)), "barrier");
  }
  ~Group() {
    const tensor::cuda::DeviceGuard on(settings_.device, "nccl");
    if (comm_ != nullptr) {
      // Finalize flushes what was issued (polled: a peer that left must not hang us).
      try {
        flush("nccl");
        nccl_settle(comm_, ncclCommFinalize(comm_), "nccl", "ncclCommFinalize", settings_.device,
                    Clock::now() + settings_.timeout);
        ncclCommDestroy(comm_);
      } catch (...) {
        ncclCommAbort(comm_);  // a peer never finished: abort rather than hang
      }
    }
    cudaFree(barrier_word_);
    cudaStreamDestroy(stream_);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  const NcclSettings& settings() const { return settings_; }
  const std::shared_ptr<CommStats>& stats() const { return stats_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }
  float* barrier_word() const { return static_cast<float*>(barrier_word_); }
  const Communicator& host() const { return host_; }

  void throw_if_failed() const {
    if (failed_) throw CommError(failure_);
  }
  /// Checks a buffer is on this process's GPU (an empty one may be anywhere: NCCL reads
  /// none of it).
  void check_device(const char* op, const Buffer& b) const {
    if (b.count == 0) return;
    DISTJAX_CHECK(b.device.kind == DeviceKind::CUDA && b.device.index == settings_.device,
                  NotImplemented, "[", op, "] buffers on ", b.device.str(),
                  " are out of reach of the nccl backend, which moves memory on cuda:",
                  settings_.device, " (this process's GPU)");
  }
  /// Records call d in the flight records; returns it with its sequence number.
  CallDesc issue(OpKind op, std::int64_t count = 0, DType dtype = DType::F32,
                 ReduceOp reduce = ReduceOp::Sum, int root = 0, std::uint64_t pairs = 0) {
    const CallDesc d = detail::make_desc(seq_++, op, count, dtype, reduce, root, pairs);
    last_[d.seq % last_.size()] = d;
    return d;
  }
  /// " at call #k of group (0,1)".
  std::string where(const CallDesc& d) const {
    return " at call #" + std::to_string(d.seq) + " of group " + label_;
  }

  /// The communication stream waits for the compute stream's work so far.
  void order_after_compute(const char* op) {
    const Event ready = record(cudaStreamPerThread, op);
    DISTJAX_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready.get(), 0), op);
  }
  /// A send or receive inside a group failed: the group is closed, the communicator
  /// aborted and the group failed (its queued transfers would never complete).
  [[noreturn]] void refused(ncclResult_t r, const char* op, const char* call) {
    ncclGroupEnd();
    try {
      raise_nccl(r, op, call, settings_.device, comm_);
    } catch (const CommError& e) {
      fail_now(e.what());
    }
  }
  /// Checks an NCCL call issued on the communication stream (settling ncclInProgress);
  /// fails the group on an error.
  void check(ncclResult_t r, const char* op, const char* call) {
    if (r == ncclSuccess) return;
    try {
      nccl_settle(comm_, r, op, call, settings_.device, Clock::now() + settings_.timeout);
    } catch (const CommError& e) {
      fail_now(e.what());
    }
  }

  void post(P2pOp op) { pending_.push_back(std::move(op)); }
  /// Issues the queued transfers as one NCCL group (see the top of this file).
  void flush(const char* op) {
    std::vector<P2pOp> ops;
    ops.swap(pending_);
    std::erase_if(ops, [](const P2pOp& o) { return o.state->cancelled; });
    if (ops.empty()) return;
    for (const P2pOp& o : ops)
      DISTJAX_CUDA_CHECK(cudaStreamWaitEvent(stream_, o.ready.get(), 0), op);
    check(ncclGroupStart(), op, "ncclGroupStart");
    for (const P2pOp& o : ops) {
      const auto n = static_cast<std::size_t>(o.buf.count);
      const ncclResult_t r =
          o.is_send ? ncclSend(o.buf.data, n, nccl_type(o.buf.dtype), o.peer, comm_, stream_)
                    : ncclRecv(o.buf.data, n, nccl_type(o.buf.dtype), o.peer, comm_, stream_);
      if (r != ncclSuccess && r != ncclInProgress)
        refused(r, op, o.is_send ? "ncclSend" : "ncclRecv");
    }
    check(ncclGroupEnd(), op, "ncclGroupEnd");
    const Event done = record(stream_, op);
    for (P2pOp& o : ops)
      o.state->done = done;
  }

  /// Waits for `done` until the timeout; then the compute stream waits on it too. At the
  /// timeout aborts the communicator and fails the group with `what` + the diagnosis.
  void wait(const Event& done, const std::string& what, bool collective, const CallDesc& d) {
    const Clock::time_point deadline = Clock::now() + settings_.timeout;
    Backoff backoff;
    while (!ready(done, what)) {
      if (Clock::now() >= deadline) timeout(what, collective, d);
      backoff.pause();
    }
  }
  /// True when `done` has fired (the compute stream then waits on it); throws CommError
  /// when NCCL reports an asynchronous error (the group fails).
  bool ready(const Event& done, const std::string& what) {
    throw_if_failed();
    const cudaError_t q = cudaEventQuery(done.get());
    if (q == cudaSuccess) {
      DISTJAX_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamPerThread, done.get(), 0), "nccl");
      return true;
    }
    if (q != cudaErrorNotReady) DISTJAX_CUDA_CHECK(q, "nccl", what);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const char* last = ncclGetLastError(comm_);
      fail_now(what + " failed inside NCCL on cuda:" + std::to_string(settings_.device) + ": " +
               ncclGetErrorString(async) + (last && *last ? std::string(" (") + last + ")" : ""));
    }
    return false;
  }

  [[noreturn]] void fail_now(const std::string& msg) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    failed_ = true;
    failure_ = msg;
    throw CommError(msg);
  }

 private:
  [[noreturn]] void timeout(const std::string& what, bool collective, const CallDesc& d) {
    // Abort first: it stops this device's NCCL kernels, whatever the diagnosis takes.
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    std::string msg = what + " timed out after " + std::to_string(settings_.timeout.count()) +
                      " ms" + (collective ? where(d) : " on group " + label_) +
                      "; the NCCL communicator was aborted (ncclCommAbort)";
    if (collective) msg += diagnose(d);
    fail_now(msg);
  }

  // What the group's devices called at sequence number d.seq: each device's descriptor
  // exchanged over the host communicator (the others reach this exchange at their own
  // timeout; a device that completed the call or left makes the exchange itself time out,
  // and the host communicator's message says which).
  std::string diagnose(const CallDesc& d) {
    if (!host_.valid()) {
      std::string local = "; this device's last calls:";
      for (std::uint64_t s = d.seq >= 3 ? d.seq - 3 : 0; s <= d.seq; ++s)
        local += " #" + std::to_string(s) + " " + detail::describe(last_[s % last_.size()]);
      return local + " (no host communicator to ask the other devices: launched without MPI)";
    }
    static_assert(sizeof(CallDesc) % sizeof(std::int64_t) == 0);
    constexpr std::int64_t kWords = sizeof(CallDesc) / sizeof(std::int64_t);
    std::vector<CallDesc> all(static_cast<std::size_t>(size()));
    try {
      Communicator host = host_;
      host.all_gather(&d, all.data(), kWords, DType::I64);
    } catch (const std::exception& e) {
      return std::string("; asking the other devices over the host communicator failed: ") +
             e.what();
    }
    const std::string mismatch = detail::mismatch_message(all, members_);
    return mismatch.empty() ? "; every device of the group called " + detail::describe(d) +
                                  " (the same call: NCCL itself did not complete it)"
                            : "; " + mismatch;
  }

  ncclComm_t comm_;
  int rank_;
  std::vector<int> members_;
  std::string label_;
  Communicator host_;
  NcclSettings settings_;
  std::shared_ptr<CommStats> stats_;
  cudaStream_t stream_ = nullptr;
  void* barrier_word_ = nullptr;
  std::uint64_t seq_ = 0;
  std::array<CallDesc, 32> last_{};
  bool failed_ = false;
  std::string failure_;
  std::vector<P2pOp> pending_;
};

class NcclCommunicator;

// A collective in flight: completes on its done event.
class CollectiveRequest final : public RequestImpl {
 public:
  CollectiveRequest(std::shared_ptr<NcclCommunicator> owner, std::shared_ptr<Group> g, Event done,
                    CallDesc d, const detail::Traffic& t)
      : owner_(std::move(owner)), g_(std::move(g)), done_(std::move(done)), d_(d), traffic_(t) {}
  ~CollectiveRequest() override {
    if (complete_) return;
    try {
      wait();
    } catch (...) {
      // Errors of an abandoned request are dropped (request.hpp); the group has failed.
    }
  }
  void wait() override;
  bool test() override;

 private:
  void finish();
  std::shared_ptr<NcclCommunicator> owner_;
  std::shared_ptr<Group> g_;
  Event done_;
  CallDesc d_;
  detail::Traffic traffic_;
  Clock::time_point start_ = Clock::now();
  bool complete_ = false;
};

// A queued or issued point-to-point transfer.
class TransferRequest final : public RequestImpl {
 public:
  TransferRequest(std::shared_ptr<Group> g, std::shared_ptr<P2pState> s, bool is_send,
                  std::string what, int stats_group)
      : g_(std::move(g)),
        s_(std::move(s)),
        is_send_(is_send),
        what_(std::move(what)),
        stats_group_(stats_group) {}
  ~TransferRequest() override {
    if (complete_) return;
    if (!s_->done) {
      s_->cancelled = true;  // never issued: nothing to wait for
      return;
    }
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (complete_) return;
    const Clock::time_point t0 = Clock::now();
    g_->throw_if_failed();
    const tensor::cuda::DeviceGuard on(g_->settings().device, "nccl");
    if (!s_->done) g_->flush(is_send_ ? "send" : "recv");
    g_->wait(s_->done, what_, /*collective=*/false, CallDesc{});  // flush issued it or threw
    complete(t0);
  }
  bool test() override {
    if (complete_) return true;
    const Clock::time_point t0 = Clock::now();
    const tensor::cuda::DeviceGuard on(g_->settings().device, "nccl");
    g_->throw_if_failed();
    if (!s_->done) g_->flush(is_send_ ? "send" : "recv");
    if (!g_->ready(s_->done, what_)) return false;
    complete(t0);
    return true;
  }

 private:
  void complete(Clock::time_point t0) {
    complete_ = true;
    detail::count_wait(*g_->stats(), stats_group_, is_send_,
                       std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::shared_ptr<Group> g_;
  std::shared_ptr<P2pState> s_;
  bool is_send_;
  std::string what_;
  int stats_group_;
  bool complete_ = false;
};

class NcclCommunicator final : public CommunicatorImpl,
                               public std::enable_shared_from_this<NcclCommunicator> {
 public:
  explicit NcclCommunicator(std::shared_ptr<Group> g)
      : CommunicatorImpl(g->rank(), g->members(), g->stats()), g_(std::move(g)) {}

  // Every call is queued on the communication stream and returns its request: a caller
  // that waits at once (Completion::Now) waits on it as on any other.
  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op, Completion) override {
    const char* name = "all_reduce";
    const Start s(*g_, name, send, recv);
    const CallDesc d = g_->issue(OpKind::AllReduce, recv.count, recv.dtype, op);
    reduce(name, send, recv, op, /*scatter=*/false);
    return finish(s, d, detail::ring_traffic(OpKind::AllReduce, recv.bytes(), size()));
  }
  Request iall_gather(const Buffer& send, const Buffer& recv, Completion) override {
    const char* name = "all_gather";
    const Start s(*g_, name, send, recv);
    const CallDesc d = g_->issue(OpKind::AllGather, send.count, send.dtype);
    g_->check(ncclAllGather(send.data, recv.data, static_cast<std::size_t>(send.count),
                            nccl_type(send.dtype), g_->comm(), g_->stream()),
              name, "ncclAllGather");
    return finish(s, d, detail::ring_traffic(OpKind::AllGather, send.bytes(), size()));
  }
  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                          Completion) override {
    const char* name = "reduce_scatter";
    const Start s(*g_, name, send, recv);
    const CallDesc d = g_->issue(OpKind::ReduceScatter, recv.count, recv.dtype, op);
    reduce(name, send, recv, op, /*scatter=*/true);
    return finish(s, d, detail::ring_traffic(OpKind::ReduceScatter, recv.bytes(), size()));
  }
  Request iall_to_all(const Buffer& send, const Buffer& recv, Completion) override {
    const char* name = "all_to_all";
    const Start s(*g_, name, send, recv);
    const std::int64_t block = send.count / size();
    const CallDesc d = g_->issue(OpKind::AllToAll, block, send.dtype);
    const std::size_t bytes = static_cast<std::size_t>(block) * dtype_size(send.dtype);
    g_->check(ncclGroupStart(), name, "ncclGroupStart");
    for (int j = 0; j < size(); ++j) {
      send_recv(name, static_cast<char*>(send.data) + j * bytes, block, send.dtype, j, true);
      send_recv(name, static_cast<char*>(recv.data) + j * bytes, block, send.dtype, j, false);
    }
    g_->check(ncclGroupEnd(), name, "ncclGroupEnd");
    return finish(s, d,
                  detail::ring_traffic(OpKind::AllToAll, static_cast<std::int64_t>(bytes), size()));
  }
  Request ibroadcast(const Buffer& buf, int root, Completion) override {
    const char* name = "broadcast";
    const Start s(*g_, name, buf, buf);
    const CallDesc d = g_->issue(OpKind::Broadcast, buf.count, buf.dtype, ReduceOp::Sum, root);
    g_->check(ncclBroadcast(buf.data, buf.data, static_cast<std::size_t>(buf.count),
                            nccl_type(buf.dtype), root, g_->comm(), g_->stream()),
              name, "ncclBroadcast");
    return finish(s, d,
                  detail::ring_traffic(OpKind::Broadcast, buf.bytes(), size(), rank() == root));
  }
  Request ipermute(const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs, Completion) override {
    const char* name = "permute";
    const Start s(*g_, name, send, recv);
    const CallDesc d = g_->issue(OpKind::Permute, send.count, send.dtype, ReduceOp::Sum, 0,
                                 detail::hash_pairs(pairs));
    int to = -1, from = -1;
    for (const auto& [src, dst] : pairs) {
      if (src == rank()) to = dst;
      if (dst == rank()) from = src;
    }
    // Both halves in one group: a ring's sends and receives progress together.
    g_->check(ncclGroupStart(), name, "ncclGroupStart");
    if (to >= 0) send_recv(name, send.data, send.count, send.dtype, to, true);
    if (from >= 0) send_recv(name, recv.data, recv.count, recv.dtype, from, false);
    g_->check(ncclGroupEnd(), name, "ncclGroupEnd");
    if (from < 0 && recv.count > 0)
      DISTJAX_CUDA_CHECK(
          cudaMemsetAsync(recv.data, 0, static_cast<std::size_t>(recv.bytes()), g_->stream()),
          name);
    detail::Traffic t;
    if (to >= 0 && to != rank()) t.sent = send.bytes();
    if (from >= 0 && from != rank()) t.received = recv.bytes();
    t.steps = 1;
    return finish(s, d, t);
  }
  void barrier() override {
    const char* name = "barrier";
    const Buffer word{g_->barrier_word(), 1, DType::F32, {DeviceKind::CUDA, g_->settings().device}};
    const Start s(*g_, name, word, word);
    const CallDesc d = g_->issue(OpKind::Barrier);
    g_->check(
        ncclAllReduce(word.data, word.data, 1, ncclFloat32, ncclSum, g_->comm(), g_->stream()),
        name, "ncclAllReduce");
    finish(s, d, detail::Traffic{}).wait();
  }

  Request isend(const Buffer& buf, int dst, int tag) override { return post(buf, dst, tag, true); }
  Request irecv(const Buffer& buf, int src, int tag) override { return post(buf, src, tag, false); }

  std::shared_ptr<CommunicatorImpl> split(int color, int key) override;

  // Accessed by the requests.
  const std::shared_ptr<Group>& group_state() const { return g_; }

 private:
  // The common start of a collective, alive until it is issued: checks, this process's
  // GPU current, queued transfers issued first, the communication stream after compute.
  struct Start {
    Start(Group& g, const char* op, const Buffer& send, const Buffer& recv)
        : on((checks(g, op, send, recv), g.settings().device), op) {
      g.flush(op);
      g.order_after_compute(op);
    }
    static void checks(const Group& g, const char* op, const Buffer& send, const Buffer& recv) {
      g.throw_if_failed();
      g.check_device(op, send);
      g.check_device(op, recv);
    }
    tensor::cuda::DeviceGuard on;
  };
  Request finish(const Start&, const CallDesc& d, const detail::Traffic& t) {
    const Event done = record(g_->stream(), op_kind_name(static_cast<OpKind>(d.op)));
    return Request(std::make_unique<CollectiveRequest>(shared_from_this(), g_, done, d, t));
  }
  void send_recv(const char* op, void* p, std::int64_t n, DType t, int peer, bool is_send) {
    const ncclResult_t r = is_send ? ncclSend(p, static_cast<std::size_t>(n), nccl_type(t), peer,
                                              g_->comm(), g_->stream())
                                   : ncclRecv(p, static_cast<std::size_t>(n), nccl_type(t), peer,
                                              g_->comm(), g_->stream());
    if (r != ncclSuccess && r != ncclInProgress)
      g_->refused(r, op, is_send ? "ncclSend" : "ncclRecv");
  }
  // all_reduce / reduce_scatter; bf16 and f16 sums (and means) widened to f32 first when
  // the settings ask (NCCL adds halves in their own precision at every step of its ring).
  void reduce(const char* op, const Buffer& send, const Buffer& recv, ReduceOp rop, bool scatter) {
    const cudaStream_t st = g_->stream();
    const auto call = [&](const void* in, void* out, DType t) {
      const std::size_t n = static_cast<std::size_t>(recv.count);
      g_->check(scatter ? ncclReduceScatter(in, out, n, nccl_type(t), nccl_op(rop), g_->comm(), st)
                        : ncclAllReduce(in, out, n, nccl_type(t), nccl_op(rop), g_->comm(), st),
                op, scatter ? "ncclReduceScatter" : "ncclAllReduce");
    };
    if (!(is_half(recv.dtype) && rop != ReduceOp::Max && g_->settings().half_reduce_in_f32) ||
        recv.count == 0) {
      call(send.data, recv.data, recv.dtype);
      return;
    }
    // f32 scratch on the communication stream: send widened (send.count), the result
    // (recv.count) narrowed into recv; freed in stream order after the reduction.
    const std::size_t in_n = static_cast<std::size_t>(send.count);
    const std::size_t out_n = static_cast<std::size_t>(recv.count);
    void* scratch = nullptr;
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, (in_n + out_n) * sizeof(float), st), op,
                       (in_n + out_n) * sizeof(float), " bytes of f32 scratch");
    float* in32 = static_cast<float*>(scratch);
    float* out32 = in32 + in_n;
    const Device gpu{DeviceKind::CUDA, g_->settings().device};
    try {
      tensor::raw::convert(op, gpu, send.data, send.dtype, in32, DType::F32,
                           static_cast<std::int64_t>(in_n), st);
      call(in32, out32, DType::F32);
      tensor::raw::convert(op, gpu, out32, DType::F32, recv.data, recv.dtype,
                           static_cast<std::int64_t>(out_n), st);
    } catch (...) {
      cudaFreeAsync(scratch, st);
      throw;
    }
    DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, st), op);
  }
  Request post(const Buffer& buf, int peer, int tag, bool is_send) {
    const char* op = is_send ? "send" : "recv";
    g_->throw_if_failed();
    g_->check_device(op, buf);
    const tensor::cuda::DeviceGuard on(g_->settings().device, op);
    auto state = std::make_shared<P2pState>();
    std::ostringstream what;
    what << "[" << op << "] " << (is_send ? "send" : "receive") << " of " << buf.count << " "
         << dtype_name(buf.dtype) << (is_send ? " to" : " from") << " rank " << peer << " (tag "
         << tag << "; NCCL matches the transfers of two ranks in the order they "
         << "are posted, not by tag)";
    g_->post({is_send, buf, peer, tag, record(cudaStreamPerThread, op), state});
    detail::count_post(*this, is_send, buf.bytes(), peer == rank());
    return Request(std::make_unique<TransferRequest>(g_, std::move(state), is_send, what.str(),
                                                     stats_group()));
  }

  std::shared_ptr<Group> g_;
};

void CollectiveRequest::wait() {
  if (complete_) return;
  const tensor::cuda::DeviceGuard on(g_->settings().device, "nccl");
  const char* op = op_kind_name(static_cast<OpKind>(d_.op));
  g_->wait(done_, std::string("[") + op + "] " + detail::describe(d_), /*collective=*/true, d_);
  finish();
}

bool CollectiveRequest::test() {
  if (complete_) return true;
  const tensor::cuda::DeviceGuard on(g_->settings().device, "nccl");
  const char* op = op_kind_name(static_cast<OpKind>(d_.op));
  if (!g_->ready(done_, std::string("[") + op + "] " + detail::describe(d_))) return false;
  finish();
  return true;
}

void CollectiveRequest::finish() {
  complete_ = true;
  // Counted once, at completion, from issue to completion (communicator.hpp).
  detail::CallTimer timer(*owner_, static_cast<OpKind>(d_.op), traffic_, nullptr, start_);
}

std::shared_ptr<CommunicatorImpl> NcclCommunicator::split(int color, int key) {
  const char* op = "split";
  g_->throw_if_failed();
  const tensor::cuda::DeviceGuard on(g_->settings().device, op);
  g_->flush(op);
  const CallDesc d = g_->issue(OpKind::Split);
  // Every rank's (color, key, world rank), gathered over NCCL itself: the members of the
  // new group, which ncclCommSplit does not report.
  const std::int64_t mine[3] = {color, key, global_rank()};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size()));
  void* dev = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocAsync(&dev, (3 + all.size()) * sizeof(std::int64_t), g_->stream()),
                     op);
  auto* dmine = static_cast<std::int64_t*>(dev);
  DISTJAX_CUDA_CHECK(
      cudaMemcpyAsync(dmine, mine, sizeof(mine), cudaMemcpyHostToDevice, g_->stream()), op);
  g_->order_after_compute(op);
  g_->check(ncclAllGather(dmine, dmine + 3, 3, ncclInt64, g_->comm(), g_->stream()), op,
            "ncclAllGather");
  // Waited on against the timeout first: a copy into pageable host memory blocks the host
  // until the stream reaches it, which must not be before the gather has completed.
  g_->wait(record(g_->stream(), op), "[split] " + detail::describe(d), true, d);
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(all.data(), dmine + 3, all.size() * sizeof(std::int64_t),
                                     cudaMemcpyDeviceToHost, g_->stream()),
                     op);
  DISTJAX_CUDA_CHECK(cudaFreeAsync(dev, g_->stream()), op);
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(g_->stream()), op);
  const detail::SplitMembers sm = detail::split_members(all, rank());

  ncclConfig_t config;
  nccl_config(config);
  ncclComm_t sub = nullptr;
  const ncclResult_t r = ncclCommSplit(g_->comm(), color, key, &sub, &config);
  // Non-blocking, NCCL reports the split's progress on the parent and writes the new handle
  // only once it is done (NCCL 2.28 returned with `sub` still null, seen on an H200; NCCL
  // issue 1472 describes this): settle the parent, wait for the handle, then settle the
  // child, whose own initialisation may still be in progress.
  const Clock::time_point deadline = Clock::now() + g_->settings().timeout;
  const int device = g_->settings().device;
  std::atomic_ref<ncclComm_t> handle(sub);
  try {
    nccl_settle(g_->comm(), r, op, "ncclCommSplit", device, deadline);
    Backoff backoff;
    while (handle.load(std::memory_order_acquire) == nullptr) {
      if (Clock::now() >= deadline)
        DISTJAX_THROW(CommError, "[", op, "] ncclCommSplit completed on cuda:", device,
                      " without giving the new communicator before the timeout");
      backoff.pause();
    }
    nccl_settle(handle.load(), ncclInProgress, op, "ncclCommSplit", device, deadline);
  } catch (const CommError& e) {
    if (handle.load() != nullptr) ncclCommAbort(handle.load());
    g_->fail_now(e.what());
  }
  Communicator host;
  if (g_->host().valid()) host = g_->host().split(color, key);
  auto sub_group = std::make_shared<Group>(handle.load(), sm.rank, sm.members, std::move(host),
                                           g_->settings(), g_->stats());
  return std::make_shared<NcclCommunicator>(std::move(sub_group));
}

}  // namespace

std::shared_ptr<CommunicatorImpl> make_communicator(ncclComm_t comm, int rank,
                                                    std::vector<int> members, Communicator host,
                                                    const NcclSettings& settings,
                                                    std::shared_ptr<CommStats> stats) {
  auto g = std::make_shared<Group>(comm, rank, std::move(members), std::move(host), settings,
                                   std::move(stats));
  return std::make_shared<NcclCommunicator>(std::move(g));
}

}  // namespace distjax::comm::nccl
