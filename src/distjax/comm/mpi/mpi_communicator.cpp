// The MPI backend: one process per device, launched by mpirun / srun. Collectives are
// MPI collectives; with each one the ranks exchange a hash of their call descriptors
// point-to-point on a private duplicate communicator with a deadline (exchange.hpp), so
// a mismatch or a missing rank raises CommError naming the op and the ranks instead of
// hanging. A small all-reduce travels inside that exchange itself, in both modes: one
// round of messages checks it and carries its data. Several devices per process are not
// implemented (devices_per_process must be 1).
//
// No silent hangs: every wait is a nonblocking MPI call polled against a deadline (the
// collective itself too, as MPI_Iallreduce etc.: a rank that passed the descriptor check
// while a peer failed it would otherwise block forever). While waiting, every rank also
// polls a process-wide channel of notices (notices.hpp): a process whose device program
// throws sends a notice to every other process before launch rethrows, and their pending
// calls raise CommError "device N failed: ..." at once; one whose program returns says
// how many calls it issued on each group, and a call it never issued fails at once
// naming it. The few calls MPI only has in blocking form (MPI_Comm_split, the first
// duplicate of MPI_COMM_WORLD) run under a watchdog thread that prints what blocked and
// calls MPI_Abort once they exceed the timeout.
//
// This file is the transport: the MPI calls that move data (collectives, point-to-point,
// their requests, the exchanges and the order in which data operations are posted). A
// wait that goes wrong is handed to the group's GroupDiagnosis (diagnosis.hpp), which
// keeps the failure and builds the message naming the op and the devices.
// The C API only: OpenMPI's mpi.h pulls in its C++ bindings otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/detail/call_timer.hpp"
#include "distjax/comm/detail/host_buffers.hpp"
#include "distjax/comm/mpi/diagnosis.hpp"
#include "distjax/comm/mpi/exchange.hpp"
#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/comm/mpi/guards.hpp"
#include "distjax/comm/mpi/mpi_communicator.hpp"
#include "distjax/comm/mpi/staging.hpp"
#include "distjax/comm/mpi/tsc_clock.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi {

using Clock = std::chrono::steady_clock;
using namespace guards;

void guards::check(int rc, const char* op, int device) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DISTJAX_THROW(CommError, "[", op, "] MPI error on device ", device, ": ",
                std::string(msg, len));
}

namespace {

constexpr int kPermuteTag = kMaxTag + 1;
constexpr const char* kBackend = "MPI";
using detail::HostBuffers;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

int to_int(const char* op, std::int64_t count) {
  DISTJAX_CHECK(count <= INT_MAX, InvalidArgument, "[", op, "] count ", count,
                " exceeds what one MPI call can move (", INT_MAX, ")");
  return static_cast<int>(count);
}

}  // namespace

/// One process's handle on one MPI communicator.
class MpiCommunicator final : public CommunicatorImpl,
                              public std::enable_shared_from_this<MpiCommunicator> {
 public:
  /// Takes ownership of comm. `op` ("launch", "split") names the call in errors.
  MpiCommunicator(MPI_Comm comm, const LaunchOptions& opts, std::shared_ptr<CommStats> stats,
                  const char* op)
      : MpiCommunicator(comm, opts, std::move(stats), op, Clock::now() + opts.timeout) {}
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!diag_->failed()) {
      MPI_Comm_free(&xchg_comm_);
      MPI_Comm_free(&check_comm_);
      MPI_Comm_free(&comm_);
    }
  }

  // Every entry takes host access to its buffers first (a CUDA buffer is refused naming
  // the op, its blocking form's name when the caller waits at once, before the call is
  // issued); the call holds it until it completes.
  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op,
                      Completion completion) override {
    const bool now = completion == Completion::Now;
    HostBuffers access(now ? "all_reduce" : "iall_reduce", kBackend, send, recv);
    if (now && small(send)) {
      small_all_reduce(send, recv, op);
      return Request();
    }
    const int n = to_int("all_reduce", send.count);
    const DType dtype = send.dtype;
    auto call = begin(detail::make_desc(seq_, OpKind::AllReduce, send.count, dtype, op),
                      detail::ring_traffic(OpKind::AllReduce, send.bytes(), size()));
    call->access.emplace(std::move(access));
    if (small(send)) {
      call->xchg = std::make_shared<Exchange>();
      start_small(*call->xchg, call->desc, send, op);
      call->finish.push_back([x = call->xchg, recv, op, this] { finish_small(*x, recv, op); });
      add_pending(call.get());
      return Request(std::make_unique<CollectiveRequest>(shared_from_this(), std::move(call)));
    }
    const bool in_place = send.data == recv.data;
    const std::pair<Buffer, Buffer> staged = stage(*call, send, recv);
    const Buffer sb = staged.first, rb = staged.second;  // no binding: clang 14 cannot capture one
    if (op == ReduceOp::Mean) {
      const Buffer r = recv;
      call->finish.push_back(
          [r, this] { detail::divide_inplace(r.data, r.count, r.dtype, size()); });
    }
    const MPI_Datatype t = mpi_type(sb.dtype);
    const void* sp = in_place && sb.data == recv.data ? MPI_IN_PLACE : sb.data;
    return start(std::move(call), [=, this](MPI_Request* q) {
      return MPI_Iallreduce(sp, rb.data, n, t, mpi_op(op), comm_, q);
    });
  }

  Request iall_gather(const Buffer& send, const Buffer& recv, Completion completion) override {
    HostBuffers access(completion == Completion::Now ? "all_gather" : "iall_gather", kBackend,
                       send, recv);
    const int n = to_int("all_gather", recv.count) / size();
    auto call = begin(detail::make_desc(seq_, OpKind::AllGather, send.count, send.dtype),
                      detail::ring_traffic(OpKind::AllGather, send.bytes(), size()));
    call->access.emplace(std::move(access));
    const bool in_place = send.data == static_cast<char*>(recv.data) + rank() * send.bytes();
    const std::pair<Buffer, Buffer> staged = stage(*call, send, recv);
    const Buffer sb = staged.first, rb = staged.second;  // no binding: clang 14 cannot capture one
    const MPI_Datatype t = mpi_type(sb.dtype);
    const void* sp = in_place && rb.data == recv.data ? MPI_IN_PLACE : sb.data;
    return start(std::move(call), [=, this](MPI_Request* q) {
      return MPI_Iallgather(sp, n, t, rb.data, n, t, comm_, q);
    });
  }

  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                          Completion completion) override {
    HostBuffers access(completion == Completion::Now ? "reduce_scatter" : "ireduce_scatter",
                       kBackend, send, recv);
    const int n = to_int("reduce_scatter", send.count) / size();
    auto call = begin(detail::make_desc(seq_, OpKind::ReduceScatter, recv.count, recv.dtype, op),
                      detail::ring_traffic(OpKind::ReduceScatter, recv.bytes(), size()));
    call->access.emplace(std::move(access));
    const std::pair<Buffer, Buffer> staged = stage(*call, send, recv);
    const Buffer sb = staged.first, rb = staged.second;  // no binding: clang 14 cannot capture one
    if (op == ReduceOp::Mean) {
      const Buffer r = recv;
      call->finish.push_back(
          [r, this] { detail::divide_inplace(r.data, r.count, r.dtype, size()); });
    }
    const MPI_Datatype t = mpi_type(sb.dtype);
    return start(std::move(call), [=, this](MPI_Request* q) {
      return MPI_Ireduce_scatter_block(sb.data, rb.data, n, t, mpi_op(op), comm_, q);
    });
  }

  Request iall_to_all(const Buffer& send, const Buffer& recv, Completion completion) override {
    HostBuffers access(completion == Completion::Now ? "all_to_all" : "iall_to_all", kBackend,
                       send, recv);
    const int n = to_int("all_to_all", send.count) / size();
    const DType dtype = send.dtype;
    auto call = begin(detail::make_desc(seq_, OpKind::AllToAll, n, dtype),
                      detail::ring_traffic(OpKind::AllToAll, send.bytes() / size(), size()));
    call->access.emplace(std::move(access));
    return start(std::move(call), [=, this](MPI_Request* q) {
      return MPI_Ialltoall(send.data, n, mpi_type(dtype), recv.data, n, mpi_type(dtype), comm_, q);
    });
  }

  // The counts and offsets travel as int arrays that MPI reads until the call completes:
  // the call's last finish step holds them.
  Request iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                       const Buffer& recv, const std::vector<std::int64_t>& recv_counts,
                       Completion completion) override {
    const char* op = completion == Completion::Now ? "all_to_allv" : "iall_to_allv";
    HostBuffers access(op, kBackend, send, recv);
    to_int(op, std::max(send.count, recv.count));  // every offset fits an int
    struct Splits {
      std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
    };
    auto splits = std::make_shared<Splits>();
    auto fill = [](const std::vector<std::int64_t>& counts, std::vector<int>& c,
                   std::vector<int>& at) {
      int next = 0;
      for (std::int64_t k : counts) {
        c.push_back(static_cast<int>(k));
        at.push_back(next);
        next += static_cast<int>(k);
      }
    };
    fill(send_counts, splits->send_counts, splits->send_offsets);
    fill(recv_counts, splits->recv_counts, splits->recv_offsets);
    const auto es = static_cast<std::int64_t>(dtype_size(send.dtype));
    const detail::Traffic traffic{(send.count - send_counts[rank()]) * es,
                                  (recv.count - recv_counts[rank()]) * es, size() - 1};
    const DType dtype = send.dtype;
    auto call = begin(detail::make_desc(seq_, OpKind::AllToAll, detail::kVariableCount, dtype),
                      traffic);
    call->access.emplace(std::move(access));
    call->finish.push_back([splits] {});
    return start(std::move(call), [=, this](MPI_Request* q) {
      const MPI_Datatype t = mpi_type(dtype);
      return MPI_Ialltoallv(send.data, splits->send_counts.data(), splits->send_offsets.data(), t,
                            recv.data, splits->recv_counts.data(), splits->recv_offsets.data(), t,
                            comm_, q);
    });
  }
  bool has_all_to_allv() const override { return true; }

  Request ibroadcast(const Buffer& buf, int root, Completion completion) override {
    HostBuffers access(completion == Completion::Now ? "broadcast" : "ibroadcast", kBackend, buf);
    const int n = to_int("broadcast", buf.count);
    auto call = begin(
        detail::make_desc(seq_, OpKind::Broadcast, buf.count, buf.dtype, ReduceOp::Sum, root),
        detail::ring_traffic(OpKind::Broadcast, buf.bytes(), size(), rank() == root));
    call->access.emplace(std::move(access));
    return start(std::move(call), [=, this](MPI_Request* q) {
      return MPI_Ibcast(buf.data, n, mpi_type(buf.dtype), root, comm_, q);
    });
  }

  Request ipermute(const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs, Completion completion) override {
    HostBuffers access(completion == Completion::Now ? "permute" : "ipermute", kBackend, send,
                       recv);
    const int n = to_int("permute", send.count);
    const std::int64_t bytes = send.bytes();
    int src = -1, dst = -1;
    for (auto [s, d] : pairs) {
      if (d == rank()) src = s;
      if (s == rank()) dst = d;
    }
    // Bytes actually moved between devices (a self pair moves nothing).
    const bool sends = dst >= 0 && dst != rank(), receives = src >= 0 && src != rank();
    auto call = begin(detail::make_desc(seq_, OpKind::Permute, send.count, send.dtype,
                                        ReduceOp::Sum, 0, detail::hash_pairs(pairs)),
                      detail::Traffic{sends ? bytes : 0, receives ? bytes : 0,
                                      (sends || receives) ? 1 : 0});
    call->access.emplace(std::move(access));
    if (src == rank()) {
      std::memcpy(recv.data, send.data, bytes);
    } else if (src < 0 && bytes > 0) {
      std::memset(recv.data, 0, bytes);
    }
    const MPI_Datatype t = mpi_type(send.dtype);
    return start(std::move(call), [=, this](MPI_Request* q) {
      int rc = MPI_SUCCESS;
      if (receives) rc = MPI_Irecv(recv.data, n, t, src, kPermuteTag, comm_, &q[0]);
      if (sends && rc == MPI_SUCCESS)
        rc = MPI_Isend(send.data, n, t, dst, kPermuteTag, comm_, &q[1]);
      return rc;
    });
  }

  void barrier() override {
    auto call = begin(detail::make_desc(seq_, OpKind::Barrier),
                      detail::ring_traffic(OpKind::Barrier, 0, size()));
    if (checking()) {
      start(std::move(call), nullptr).wait();  // the check is itself a barrier
    } else {
      start(std::move(call), [this](MPI_Request* q) { return MPI_Ibarrier(comm_, q); }).wait();
    }
  }

  Request isend(const Buffer& buf, int dst, int tag) override {
    return post(true, buf, dst, tag);
  }
  Request irecv(const Buffer& buf, int src, int tag) override {
    return post(false, buf, src, tag);
  }

  std::shared_ptr<CommunicatorImpl> split(int color, int key) override {
    DISTJAX_CHECK(color >= 0, InvalidArgument, "[split] color must be >= 0, got ", color);
    diag_->throw_if_failed();
    auto call = begin(detail::make_desc(seq_, OpKind::Split),
                      detail::ring_traffic(OpKind::Split, 0, size()));
    Waiting waiting(&diag_->records(), call->desc);
    // Always the full descriptor exchange: MPI_Comm_split only exists in blocking form,
    // so every rank must know the others are entering it.
    diag_->agree(call->desc, tag_of(call->desc.seq), Clock::now() + opts_.timeout);
    // MPI_Comm_split is a collective on comm_ too: after every earlier data operation.
    const WaitResult w = poll_until(
        [this] {
          post_ready();
          return unposted_.empty();
        },
        Clock::now() + opts_.timeout);
    if (w != WaitResult::Done) diag_->fail_wait(w, call->desc, true);
    call->arrived = Clock::now();
    MPI_Comm sub;
    const int rc = guarded(opts_.timeout, blocked_message("split", "MPI_Comm_split", global_rank(),
                                                          opts_.timeout, diag_->where(call->desc)),
                           [&] { return MPI_Comm_split(comm_, color, key, &sub); });
    check(rc, "split", global_rank());
    try {
      auto out = std::make_shared<MpiCommunicator>(sub, opts_, shared_stats(), "split");
      complete(*call);
      return out;
    } catch (const CommError& e) {
      diag_->fail(e.what());
    }
  }

  /// A point-to-point transfer in flight.
  class MpiRequest final : public RequestImpl {
   public:
    MpiRequest(std::shared_ptr<MpiCommunicator> c, MPI_Request r, bool is_send, int peer, int tag,
               std::int64_t bytes, HostBuffers access)
        : keep_(std::move(c)),
          c_(*keep_),
          r_(r),
          is_send_(is_send),
          peer_(peer),
          tag_(tag),
          bytes_(bytes),
          stats_group_(c_.stats_group()),
          access_(std::move(access)) {}
    ~MpiRequest() override {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || r_ == MPI_REQUEST_NULL) return;
      MPI_Cancel(&r_);
      // A transfer already matched must finish; the watchdog bounds that wait.
      guarded(c_.opts_.timeout,
              blocked_message(is_send_ ? "isend" : "irecv", "MPI_Wait", c_.global_rank(),
                              c_.opts_.timeout,
                              " on a cancelled transfer in group " + c_.diag_->label()),
              [&] { return MPI_Wait(&r_, MPI_STATUS_IGNORE); });
    }
    void wait() override {
      const auto start = Clock::now();
      const auto deadline = start + c_.opts_.timeout;
      const char* name = is_send_ ? "isend" : "irecv";
      int done = r_ == MPI_REQUEST_NULL ? 1 : 0;
      WaitResult w;
      {
        Waiting waiting(&c_.diag_->records(), is_send_ ? OpKind::Send : OpKind::Recv,
                        c_.diag_->members()[peer_], tag_);
        w = poll(&r_, &done, 1, deadline, name, c_.global_rank(), Backoff::yield_window(bytes_));
      }
      if (w != WaitResult::Done) c_.diag_->throw_transfer(w, is_send_, peer_, tag_);
      access_.reset();  // done: the buffer is the caller's again
      detail::count_wait(c_.stats(), stats_group_, is_send_,
                         std::chrono::duration<double>(Clock::now() - start).count());
    }
    bool test() override {
      if (r_ == MPI_REQUEST_NULL) return true;
      advance_pending();  // pending collectives too, as a wait would
      int flag = 0;
      check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), is_send_ ? "isend" : "irecv",
            c_.global_rank());
      if (flag) access_.reset();
      return flag != 0;
    }

   private:
    std::shared_ptr<MpiCommunicator> keep_;  // the request outlives no communicator
    MpiCommunicator& c_;
    MPI_Request r_;
    bool is_send_;
    int peer_, tag_;
    std::int64_t bytes_;
    int stats_group_;  // the label in force when the transfer was posted
    std::optional<HostBuffers> access_;  // the buffer, until the transfer is done
  };

 private:
  /// One collective in flight: its flight-record entry, the MPI requests of the data
  /// (up to two: permute's receive and send) and of the check, and what to do on
  /// completion. Shared by the request and the communicator. Pending (guards.hpp) while
  /// its exchange or the posting of its data needs this process to advance it.
  struct Call final : Pending {
    explicit Call(MpiCommunicator* c) : owner(c) {}
    ~Call() {
      remove_pending(this);
      if (post) owner->forget_unposted(*this);
    }
    void advance() noexcept override { owner->advance_call(*this); }
    MpiCommunicator* owner;  // kept alive by the request, which outlives the call's wait
    detail::CallDesc desc;
    OpKind kind = OpKind::Barrier;
    detail::Traffic traffic;
    int stats_group = 0;
    Clock::time_point issued, arrived;
    bool has_arrived = false;
    MPI_Request data[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    /// The exchange of the descriptor hash (the check) and, for a small all-reduce, of
    /// the data; null when there is neither.
    std::shared_ptr<Exchange> xchg;
    std::shared_ptr<void> scratch;  // staged copies MPI reads and writes (see stage())
    /// Posts the data operation into data[] (kept until posted: after the check, unless
    /// the call is staged).
    std::function<int(MPI_Request*)> post;
    int post_rc = MPI_SUCCESS;  // of a post made by advance_call
    std::vector<std::function<void()>> finish;  // after the data arrived, in order
    bool finished = false;
    /// Host access to the caller's buffers until the call completes (or is abandoned).
    std::optional<HostBuffers> access;
    std::uint64_t seq() const { return desc.seq; }
  };

  /// The group's identity first (this process's rank in comm and the world ranks of its
  /// members, gathered by `deadline`), then its private duplicates.
  MpiCommunicator(MPI_Comm comm, const LaunchOptions& opts, std::shared_ptr<CommStats> stats,
                  const char* op, Clock::time_point deadline)
      : CommunicatorImpl(rank_in(comm), members_of(comm, opts, op, deadline), std::move(stats)),
        comm_(comm),
        opts_(opts) {
    check_comm_ = duplicate(op, deadline);
    xchg_comm_ = duplicate(op, deadline);
    diag_ = std::make_unique<GroupDiagnosis>(group(), rank(), global_rank(), check_comm_,
                                             opts_.timeout, checking());
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && *ub > 1) tag_ub_ = *ub;
  }
  /// This process's rank in comm, which from now on returns its errors.
  static int rank_in(MPI_Comm comm) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    return rank;
  }
  /// The world ranks of comm's members, in rank order (comm's first collective).
  static std::vector<int> members_of(MPI_Comm comm, const LaunchOptions& opts, const char* op,
                                     Clock::time_point deadline) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);  // whichever of the two runs first
    int size = 1, global = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &global);
    MPI_Request r;
    auto ids = std::make_shared<std::vector<int>>(size);
    check(MPI_Iallgather(&global, 1, MPI_INT, ids->data(), 1, MPI_INT, comm, &r), op, global);
    wait_setup(r, ids, deadline, opts.timeout, op, "gathering the new group's members", global);
    return *ids;
  }

  bool checking() const { return opts_.check_collectives && size() > 1; }

  /// A duplicate of comm_ that returns its errors, made by `deadline`.
  MPI_Comm duplicate(const char* op, Clock::time_point deadline) {
    MPI_Request r;
    auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    check(MPI_Comm_idup(comm_, dup.get(), &r), op, global_rank());
    wait_setup(r, dup, deadline, opts_.timeout, op, "duplicating the new group's communicator",
               global_rank());
    MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN);
    return *dup;
  }

  /// Whether an all-reduce of `send` travels inside its exchange (with the check on or
  /// off): at most Exchange::kMaxPayload bytes once bf16/f16 are widened to f32.
  static bool small(const Buffer& send) {
    const std::int64_t es = is_half(send.dtype) ? 4 : dtype_size(send.dtype);
    return send.count * es <= Exchange::kMaxPayload;
  }

  /// The tag of call `seq`'s messages on the exchange and check communicators (> 0).
  int tag_of(std::uint64_t seq) const {
    return static_cast<int>(seq % static_cast<std::uint64_t>(tag_ub_ - 1)) + 1;
  }

  /// Starts the exchange of a small all-reduce with descriptor d (halves widened to f32;
  /// Mean sums, finish_small divides).
  void start_small(Exchange& x, const detail::CallDesc& d, const Buffer& send, ReduceOp op) {
    float wide[Exchange::kMaxPayload / sizeof(float)];
    const void* p = send.data;
    DType t = send.dtype;
    if (is_half(t)) {
      widen_half(p, send.count, t, wide);
      p = wide;
      t = DType::F32;
    }
    x.start(xchg_comm_, rank(), size(), tag_of(d.seq), detail::hash_desc(d), p,
            static_cast<int>(send.count), t, op == ReduceOp::Max ? ReduceOp::Max : ReduceOp::Sum,
            "all_reduce", global_rank());
  }
  /// Writes the result of a small all-reduce's exchange into recv.
  void finish_small(const Exchange& x, const Buffer& recv, ReduceOp op) {
    if (is_half(recv.dtype)) {
      narrow_half(static_cast<const float*>(x.result()), recv.count, recv.dtype, recv.data);
    } else if (recv.count > 0) {
      std::memcpy(recv.data, x.result(), static_cast<std::size_t>(recv.bytes()));
    }
    if (op == ReduceOp::Mean) detail::divide_inplace(recv.data, recv.count, recv.dtype, size());
  }
  /// Counts a blocking small all-reduce of `send` issued at `issued`, done now.
  void count_small(const Buffer& send, Clock::time_point issued) {
    const auto end = clock_.now();
    const detail::Traffic t = detail::ring_traffic(OpKind::AllReduce, send.bytes(), size());
    const double s = std::chrono::duration<double>(end - issued).count();
    stats().add(stats_group(), OpKind::AllReduce,
                {.calls = 1,
                 .bytes_sent = t.sent,
                 .bytes_received = t.received,
                 .seconds = s,
                 .wait_seconds = s});
    if (stats().record_spans)
      stats().spans.push_back({OpKind::AllReduce, issued, end, end, t.sent});
  }
  /// A small all-reduce that the caller waits on at once waits here, on the stack: no
  /// request, no allocation, nothing but its exchange between the clock readings of its
  /// counters.
  void small_all_reduce(const Buffer& send, const Buffer& recv, ReduceOp op) {
    diag_->throw_if_failed();
    const detail::CallDesc d =
        detail::make_desc(seq_, OpKind::AllReduce, send.count, send.dtype, op);
    auto issued = clock_.now();
    ++seq_;
    diag_->records().issue(d);
    // A device failed: start nothing (the others' messages may already be here, and this
    // call would complete where theirs failed). Looking costs a trip through MPI's
    // progress engine, so back-to-back calls look once per kAbortLook: a call that skips
    // the look was issued within kAbortLook of one, and could complete where the others
    // failed only if it arrived within kAbortLook after their timeout (a race at the
    // deadline that any check has); the next call, or its wait, then fails.
    if (issued - abort_looked_ > kAbortLook) {
      issued = clock_.anchor();  // steady_clock itself, at most every kAbortLook
      abort_looked_ = issued;
      diag_->fail_if_aborted(d);
    }
    Waiting waiting(&diag_->records(), d);  // through the diagnosis too: peers ask meanwhile
    Exchange& x = *hot_;
    WaitResult w;
    try {
      start_small(x, d, send, op);
      w = poll_until([&x] { return x.progress(); }, issued + opts_.timeout);
    } catch (const CommError& e) {  // an MPI error
      give_up_hot();
      diag_->fail_mpi(d, e.what());
    }
    if (w != WaitResult::Done) {
      give_up_hot();
      diag_->fail_wait(w, d, false);
    }
    if (!x.agreed()) {
      give_up_hot();
      diag_->disagree(d, tag_of(d.seq));
    }
    finish_small(x, recv, op);
    ++diag_->records().completed;
    count_small(send, issued);
  }

  /// The blocking small all-reduce's exchange was given up on: MPI may still write into
  /// it, so it is kept (the group has failed; nothing uses it again).
  void give_up_hot() {
    graveyard().push_back(hot_);
    hot_ = std::make_shared<Exchange>();
  }

  /// Starts a call: throws if the group failed or a device failed (abort notice); takes
  /// the next sequence number (desc was made with it) and records it.
  std::shared_ptr<Call> begin(const detail::CallDesc& desc, const detail::Traffic& traffic) {
    diag_->throw_if_failed();
    auto c = std::make_shared<Call>(this);
    c->desc = desc;
    c->kind = static_cast<OpKind>(desc.op);
    c->traffic = traffic;
    c->stats_group = stats_group();
    c->issued = Clock::now();
    ++seq_;
    diag_->records().issue(desc);
    diag_->fail_if_aborted(c->desc);  // a device failed: start nothing
    return c;
  }

  /// Calls whose buffers (the larger one) hold at most this many bytes overlap their
  /// check with the data operation, on staged copies of the buffers: should the check
  /// fail, MPI may go on writing into a mismatched operation's memory, which must then
  /// not be the caller's. Larger calls post the data operation once the check passed
  /// (the copies would cost more than the check's latency saves).
  static constexpr std::int64_t kOverlapBytes = 64 * 1024;

  /// Staged copies of the buffers of a reduction or gather (kept in call.scratch), or
  /// the buffers themselves: bf16/f16 always go through f32 copies (MPI has no half
  /// reductions); other dtypes are staged when the check is on and the call is small.
  /// Adds to call.finish the copy back into recv.
  std::pair<Buffer, Buffer> stage(Call& c, const Buffer& send, const Buffer& recv) {
    if (!is_half(send.dtype) &&
        !(checking() && std::max(send.bytes(), recv.bytes()) <= kOverlapBytes))
      return {send, recv};
    Staged st = stage_copies(send, recv);
    c.scratch = std::move(st.memory);
    c.finish.push_back(std::move(st.copy_back));
    return {st.send, st.recv};
  }

  /// Starts the check (when on) and queues the data operation (`post`, if any: posted at
  /// once when the check is off or the call is staged, otherwise once the check passed,
  /// in both cases after every earlier call's, see post_ready), and returns the request
  /// of the call.
  Request start(std::shared_ptr<Call> c, std::function<int(MPI_Request*)> post) {
    if (checking()) {
      c->xchg = std::make_shared<Exchange>();
      c->xchg->start(xchg_comm_, rank(), size(), tag_of(c->seq()), detail::hash_desc(c->desc),
                     nullptr, 0, DType::F32, ReduceOp::Sum, op_kind_name(c->kind), global_rank());
    }
    c->post = std::move(post);
    if (c->post) {
      unposted_.push_back(c.get());
      post_ready();
    }
    if (c->xchg || c->post) add_pending(c.get());
    return Request(std::make_unique<CollectiveRequest>(shared_from_this(), std::move(c)));
  }

  /// Whether call c's data operation may be posted as far as c goes: its check passed,
  /// or it runs on staged copies alongside the check.
  static bool may_post(const Call& c) { return !c.xchg || c.has_arrived || c.scratch; }

  /// Posts the queued data operations that may be, in issue order: MPI matches the
  /// collectives of a communicator by the order in which each rank posts them, so no
  /// call posts before an earlier one of its group (an earlier call waiting for its check
  /// holds the later ones back; every wait advances that check, see Pending). An MPI
  /// error is kept in the call, for its wait to throw.
  void post_ready() noexcept {
    while (!unposted_.empty() && may_post(*unposted_.front())) {
      Call& c = *unposted_.front();
      unposted_.pop_front();
      auto post = std::move(c.post);
      c.post = nullptr;
      c.post_rc = post(c.data);
    }
  }
  void forget_unposted(Call& c) {
    unposted_.erase(std::remove(unposted_.begin(), unposted_.end(), &c), unposted_.end());
    c.post = nullptr;
  }

  /// Waits until call c's data operation is posted (earlier calls of the group post
  /// first): false on a timeout or an abort notice, with w telling which.
  bool wait_posted(Call& c, WaitResult& w) {
    if (c.post) post_ready();
    if (!c.post) return true;
    w = poll_until(
        [&] {
          post_ready();
          return !c.post;
        },
        Clock::now() + opts_.timeout);
    return w == WaitResult::Done;
  }

  /// Advances call c for another call's wait (Pending): its exchange, then the posting of
  /// its data once the check passed. A disagreement or an MPI error is left for c's own
  /// wait to report.
  void advance_call(Call& c) noexcept {
    if (c.finished || diag_->failed()) return;
    if (c.xchg && !c.has_arrived) {
      if (!c.xchg->try_progress() || !c.xchg->agreed()) return;
      c.arrived = Clock::now();
      c.has_arrived = true;
      post_ready();
    }
    if (!c.post) remove_pending(&c);  // MPI progresses the data operation by itself
  }

  /// A collective in flight.
  class CollectiveRequest final : public RequestImpl {
   public:
    CollectiveRequest(std::shared_ptr<MpiCommunicator> comm, std::shared_ptr<Call> call)
        : keep_(std::move(comm)), call_(std::move(call)) {}
    ~CollectiveRequest() override {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || call_->finished) return;
      try {
        keep_->wait_call(*call_);
      } catch (...) {  // dropped with the request; the group has failed
      }
    }
    void wait() override {
      if (!call_->finished) keep_->wait_call(*call_);
    }
    bool test() override {
      if (call_->finished) return true;
      return keep_->test_call(*call_);
    }

   private:
    std::shared_ptr<MpiCommunicator> keep_;
    std::shared_ptr<Call> call_;
  };

  /// Keeps what MPI may still write to (the call's own memory) past a failure.
  void abandon(Call& c) {
    if (c.scratch) graveyard().push_back(c.scratch);
    if (c.xchg) graveyard().push_back(c.xchg);
    c.access.reset();  // the launch fails (see Communicator): the caller's memory is its own
    c.finished = true;
    remove_pending(&c);
    if (c.post) forget_unposted(c);
  }

  /// Waits for call c: its check (a mismatch fails the group with every device's
  /// descriptor), then its data, each within the timeout; a timeout, an abort notice or
  /// an MPI error fails the group with a message from the flight records.
  void wait_call(Call& c) {
    if (diag_->failed()) {
      abandon(c);
      diag_->throw_if_failed();
    }
    Waiting waiting(&diag_->records(), c.desc);
    const char* name = op_kind_name(c.kind);
    if (c.xchg && !c.has_arrived) {
      Exchange& x = *c.xchg;
      WaitResult w;
      try {
        w = poll_until([&x] { return x.progress(); }, Clock::now() + opts_.timeout);
      } catch (const CommError& e) {  // an MPI error
        abandon(c);
        diag_->fail_mpi(c.desc, e.what());
      }
      if (w != WaitResult::Done) {
        abandon(c);
        diag_->fail_wait(w, c.desc, false);
      }
      arrive(c);
    }
    WaitResult w;
    if (!wait_posted(c, w)) {
      abandon(c);
      diag_->fail_wait(w, c.desc, true);
    }
    check(c.post_rc, name, global_rank());
    std::array<int, 2> done{c.data[0] == MPI_REQUEST_NULL, c.data[1] == MPI_REQUEST_NULL};
    try {
      w = poll(c.data, done.data(), 2, Clock::now() + opts_.timeout, name, global_rank(),
               Backoff::yield_window(c.traffic.sent + c.traffic.received));
    } catch (const CommError& e) {  // an MPI error: a mismatched program, or a real one
      abandon(c);
      diag_->fail_mpi(c.desc, e.what());
    }
    if (w != WaitResult::Done) {
      abandon(c);
      diag_->fail_wait(w, c.desc, c.has_arrived);
    }
    complete(c);
  }

  /// One nonblocking look at call c; completes it when everything arrived.
  bool test_call(Call& c) {
    if (diag_->failed()) {
      abandon(c);
      diag_->throw_if_failed();
    }
    advance_pending();  // the others too, as a wait would
    if (c.xchg && !c.has_arrived) {
      if (!c.xchg->progress()) return false;
      arrive(c);
    }
    post_ready();
    if (c.post) return false;  // behind an earlier call of the group
    check(c.post_rc, op_kind_name(c.kind), global_rank());
    for (MPI_Request& r : c.data) {
      int flag = 1;
      if (r != MPI_REQUEST_NULL)
        check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), op_kind_name(c.kind), global_rank());
      if (!flag) return false;
    }
    complete(c);
    return true;
  }

  /// The check completed: every rank arrived; a disagreement fails the group, after a
  /// descriptor exchange that names what each device called (every rank sees the same
  /// verdict, so all of them exchange).
  void arrive(Call& c) {
    c.arrived = Clock::now();
    c.has_arrived = true;
    if (c.xchg->agreed()) return;
    abandon(c);
    diag_->disagree(c.desc, tag_of(c.desc.seq));
  }
  void complete(Call& c) {
    remove_pending(&c);
    for (auto& f : c.finish) f();
    c.access.reset();
    c.finished = true;
    ++diag_->records().completed;
    const auto end = Clock::now();
    if (!c.has_arrived) c.arrived = end;  // no check: no separate arrival
    stats().add(c.stats_group, c.kind,
                {.calls = 1,
                 .bytes_sent = c.traffic.sent,
                 .bytes_received = c.traffic.received,
                 .seconds = std::chrono::duration<double>(end - c.issued).count(),
                 .wait_seconds = std::chrono::duration<double>(c.arrived - c.issued).count()});
    if (stats().record_spans)
      stats().spans.push_back({c.kind, c.issued, c.arrived, end, c.traffic.sent});
  }

  Request post(bool is_send, const Buffer& b, int peer, int tag) {
    const char* name = is_send ? "isend" : "irecv";
    HostBuffers access(name, kBackend, b);
    diag_->throw_if_failed();
    const int n = to_int(name, b.count);
    detail::count_post(*this, is_send, b.bytes(), peer == rank());
    MPI_Request r;
    if (is_send) {
      check(MPI_Isend(b.data, n, mpi_type(b.dtype), peer, tag, comm_, &r), name, global_rank());
    } else {
      check(MPI_Irecv(b.data, n, mpi_type(b.dtype), peer, tag, comm_, &r), name, global_rank());
    }
    return Request(std::make_unique<MpiRequest>(shared_from_this(), r, is_send, peer, tag,
                                                b.bytes(), std::move(access)));
  }

  MPI_Comm comm_;
  MPI_Comm check_comm_ = MPI_COMM_NULL;  // agree(): descriptors
  MPI_Comm xchg_comm_ = MPI_COMM_NULL;   // exchanges: hashes and small all-reduces
  std::shared_ptr<Exchange> hot_ = std::make_shared<Exchange>();  // blocking small all-reduce
  std::deque<Call*> unposted_;  // calls whose data operation waits to be posted, in order
  static constexpr std::chrono::microseconds kAbortLook{100};
  Clock::time_point abort_looked_{};  // the blocking small all-reduce's last look
  TscClock clock_;                    // the blocking small all-reduce's clock
  LaunchOptions opts_;
  int tag_ub_ = 32767;
  std::unique_ptr<GroupDiagnosis> diag_;  // failure state and messages, flight records
  std::uint64_t seq_ = 0;
};

std::shared_ptr<CommunicatorImpl> make_communicator(MPI_Comm comm, const LaunchOptions& opts,
                                                    std::shared_ptr<CommStats> stats,
                                                    const char* op) {
  return std::make_shared<MpiCommunicator>(comm, opts, std::move(stats), op);
}

}  // namespace distjax::comm::mpi
