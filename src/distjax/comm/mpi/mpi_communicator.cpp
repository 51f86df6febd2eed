// The MPI backend: one process per device, launched by mpirun / srun. Collectives are
// MPI collectives; before each one the ranks exchange call descriptors point-to-point
// on a private duplicate communicator with a deadline, so a mismatch or a missing rank
// raises CommError naming the op and the ranks instead of hanging. Several devices per
// process are not implemented (devices_per_process must be 1).
//
// No silent hangs: every wait is a nonblocking MPI call polled against a deadline (the
// collective itself too, as MPI_Iallreduce etc.: a rank that passed the descriptor check
// while a peer failed it would otherwise block forever). While waiting, every rank also
// polls a process-wide abort channel: a process whose device program throws sends a
// notice to every other process before launch rethrows, and their pending calls raise
// CommError "device N failed: ..." at once. The few calls MPI only has in blocking form
// (MPI_Comm_split, the first duplicate of MPI_COMM_WORLD) run under a watchdog thread
// that prints what blocked and calls MPI_Abort once they exceed the timeout.
// The C API only: OpenMPI's mpi.h pulls in its C++ bindings otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "distjax/comm/detail/call.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi {

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kDescTag = 1;
constexpr int kPermuteTag = kMaxTag + 1;

void check(int rc, const char* op, int device) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DISTJAX_THROW(CommError, "[", op, "] MPI error on device ", device, ": ",
                std::string(msg, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
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

bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

std::vector<float> to_f32(const void* p, std::int64_t n, DType t) {
  std::vector<float> out(n);
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = t == DType::BF16 ? static_cast<float>(static_cast<const bf16*>(p)[i])
                              : static_cast<float>(static_cast<const f16*>(p)[i]);
  return out;
}
void from_f32(const std::vector<float>& v, void* p, DType t) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::BF16) {
      static_cast<bf16*>(p)[i] = bf16(v[i]);
    } else {
      static_cast<f16*>(p)[i] = f16(v[i]);
    }
  }
}


// ---------------------------------------------------------------- watchdog
/// Last resort against hangs inside the few MPI calls that only exist in blocking form:
/// arm() before such a call, disarm() after; if the call is still running at the
/// deadline, the watchdog thread prints what blocked and ends the job with MPI_Abort.
/// One slot: only the device's own thread arms it, one call at a time.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: its thread outlives statics
    return *w;
  }
  std::uint64_t arm(Clock::time_point deadline, std::string what) {
    std::lock_guard<std::mutex> lk(m_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    armed_ = true;
    deadline_ = deadline;
    what_ = std::move(what);
    cv_.notify_one();
    return ++token_;
  }
  void disarm(std::uint64_t token) {
    std::lock_guard<std::mutex> lk(m_);
    if (token == token_) armed_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      if (!armed_) {
        cv_.wait(lk);
      } else if (Clock::now() >= deadline_) {
        std::fprintf(stderr, "%s\n", what_.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 70);
        std::_Exit(70);
      } else {
        cv_.wait_until(lk, deadline_);
      }
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  bool started_ = false, armed_ = false;
  Clock::time_point deadline_;
  std::string what_;
  std::uint64_t token_ = 0;
};

/// Runs a blocking MPI call f() under the watchdog; returns its error code.
template <class F>
int guarded(std::chrono::milliseconds limit, const std::string& what, F&& f) {
  Watchdog& w = Watchdog::get();
  const std::uint64_t token = w.arm(Clock::now() + limit, what);
  const int rc = f();
  w.disarm(token);
  return rc;
}

/// "[split] device 1 blocked in MPI_Comm_split for more than 500 ms at call #2 of group
/// (0,1,2,3) ...": the watchdog's message.
std::string blocked_message(const char* op, const char* mpi_call, int device,
                            std::chrono::milliseconds limit, const std::string& where) {
  std::ostringstream os;
  os << "[" << op << "] CommError: device " << device << " blocked in " << mpi_call
     << " for more than " << limit.count() << " ms" << where
     << " (a peer failed or never arrived); DistJax aborts the MPI job instead of hanging";
  return os.str();
}

// ---------------------------------------------------------------- abort channel
/// Process-wide channel on which a failing process tells every other process that its
/// device program threw. Each launch is one epoch (a tag): every process keeps one
/// receive posted for the current epoch, and every wait polls it.
constexpr int kNoticeBytes = 2048;
struct AbortChannel {
  MPI_Comm comm = MPI_COMM_NULL;
  int tag_ub = 32767;
  std::uint64_t epoch = 0;
  MPI_Request recv = MPI_REQUEST_NULL;
  char buf[kNoticeBytes] = {};
  bool received = false;
  std::string notice;               // "device N failed: <its message>"
  std::deque<std::string> sent;     // send buffers (kept alive: the sends are freed)
  int tag() const { return static_cast<int>(epoch % static_cast<std::uint64_t>(tag_ub)); }
};
AbortChannel& channel() {
  static AbortChannel* c = new AbortChannel();
  return *c;
}

/// The notice of this epoch if one has arrived (never blocks), else nullptr.
const std::string* poll_abort() {
  AbortChannel& ch = channel();
  if (ch.received) return &ch.notice;
  if (ch.recv == MPI_REQUEST_NULL) return nullptr;
  int flag = 0;
  MPI_Status st;
  if (MPI_Test(&ch.recv, &flag, &st) != MPI_SUCCESS || !flag) return nullptr;
  int len = 0;
  MPI_Get_count(&st, MPI_CHAR, &len);
  ch.received = true;
  ch.notice = "device " + std::to_string(st.MPI_SOURCE) + " failed: " +
              std::string(ch.buf, static_cast<std::size_t>(std::max(0, len)));
  return &ch.notice;
}

/// Float copies of a bf16/f16 collective's buffers.
struct Scratch {
  Scratch(std::vector<float> s, std::int64_t recv_count) : send(std::move(s)), recv(recv_count) {}
  std::vector<float> send, recv;
};
/// Buffers of abandoned collectives: MPI cannot cancel those, so their memory is kept
/// until the process ends.
std::vector<std::shared_ptr<void>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<void>>();
  return *g;
}

/// How long a wait keeps polling after an abort notice, so a call that can still
/// complete does (and leaves no request behind); the next call then fails.
constexpr std::chrono::milliseconds kAbortGrace{100};

enum class WaitResult { Done, TimedOut, Aborted };

/// Polls reqs until all complete (done[i] turns 1 as request i does), the deadline
/// passes, or an abort notice arrives. Completed requests become MPI_REQUEST_NULL.
WaitResult poll(MPI_Request* reqs, int* done, std::size_t n, Clock::time_point deadline,
                const char* op, int device) {
  bool aborted = false;
  for (int spins = 0;; ++spins) {
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      check(MPI_Test(&reqs[i], &done[i], MPI_STATUS_IGNORE), op, device);
      all = all && done[i];
    }
    if (all) return WaitResult::Done;
    if (!aborted && poll_abort() != nullptr) {
      aborted = true;
      deadline = std::min(deadline, Clock::now() + kAbortGrace);
    }
    if (Clock::now() > deadline) return aborted ? WaitResult::Aborted : WaitResult::TimedOut;
    if (spins > 256) std::this_thread::yield();
  }
}

/// Waits for one nonblocking call made while setting up a communicator; throws
/// CommError on timeout or abort notice (the request is then abandoned, and `out`, the
/// memory MPI writes its result to, is kept alive).
void wait_setup(MPI_Request& r, std::shared_ptr<void> out, Clock::time_point deadline,
                std::chrono::milliseconds timeout, const char* op, const char* what,
                int device) {
  int done = 0;
  WaitResult w = poll(&r, &done, 1, deadline, op, device);
  if (w == WaitResult::Done) return;
  r = MPI_REQUEST_NULL;
  graveyard().push_back(std::move(out));
  if (w == WaitResult::Aborted)
    DISTJAX_THROW(CommError, "[", op, "] ", what, " abandoned: ", *poll_abort());
  DISTJAX_THROW(CommError, "[", op, "] timed out after ", timeout.count(), " ms in ", what,
                " on device ", device, ": some device did not arrive");
}

/// Opens the abort channel for a new launch (creating it on first use).
void open_epoch(std::chrono::milliseconds timeout, int device) {
  AbortChannel& ch = channel();
  if (ch.comm == MPI_COMM_NULL) {
    check(guarded(timeout,
                  blocked_message("launch", "MPI_Comm_dup(MPI_COMM_WORLD)", device, timeout,
                                  " while starting the MPI backend"),
                  [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &ch.comm); }),
          "launch", device);
    MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && *ub > 0) ch.tag_ub = *ub;
  }
  ch.epoch += 1;
  ch.received = false;
  ch.notice.clear();
  check(MPI_Irecv(ch.buf, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, ch.tag(), ch.comm, &ch.recv),
        "launch", device);
}

/// Closes this launch's epoch: withdraws the posted receive. Notices that arrive later
/// (other processes still failing) keep this epoch's tag and are never matched again.
void close_epoch() {
  AbortChannel& ch = channel();
  if (ch.recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&ch.recv);
    MPI_Wait(&ch.recv, MPI_STATUS_IGNORE);
  }
  ch.received = false;
}

/// Tells every other process that this process's device program failed with `what`,
/// unless this process itself learned of a failure from a notice (everyone has it).
void send_abort(const std::string& what, int device) {
  AbortChannel& ch = channel();
  if (ch.comm == MPI_COMM_NULL || poll_abort() != nullptr) return;
  ch.sent.push_back(what.substr(0, kNoticeBytes));
  const std::string& buf = ch.sent.back();
  int world = 1;
  MPI_Comm_size(ch.comm, &world);
  for (int p = 0; p < world; ++p) {
    if (p == device) continue;
    MPI_Request r;
    if (MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, p, ch.tag(), ch.comm,
                  &r) == MPI_SUCCESS)
      MPI_Request_free(&r);  // small (eager) message; the buffer stays alive in ch.sent
  }
}

}  // namespace

/// One process's handle on one MPI communicator.
class MpiCommunicator final : public CommunicatorImpl,
                              public std::enable_shared_from_this<MpiCommunicator> {
 public:
  /// Takes ownership of comm. `op` ("launch", "split") names the call in errors.
  MpiCommunicator(MPI_Comm comm, const LaunchOptions& opts, std::shared_ptr<CommStats> stats,
                  const char* op)
      : comm_(comm), opts_(opts), stats_(std::move(stats)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &global_);
    const auto deadline = Clock::now() + opts_.timeout;
    MPI_Request r;
    auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    check(MPI_Comm_idup(comm_, dup.get(), &r), op, global_);
    wait_setup(r, dup, deadline, opts_.timeout, op, "duplicating the new group's communicator",
               global_);
    check_comm_ = *dup;
    MPI_Comm_set_errhandler(check_comm_, MPI_ERRORS_RETURN);
    auto ids = std::make_shared<std::vector<int>>(size_);
    check(MPI_Iallgather(&global_, 1, MPI_INT, ids->data(), 1, MPI_INT, comm_, &r), op, global_);
    wait_setup(r, ids, deadline, opts_.timeout, op, "gathering the new group's members", global_);
    members_ = *ids;
    label_ = detail::group_label(members_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!failed_) {
      MPI_Comm_free(&check_comm_);
      MPI_Comm_free(&comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int global_rank() const override { return global_; }
  const std::vector<int>& group() const override { return members_; }
  CommStats& stats() override { return *stats_; }

  void all_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                  ReduceOp op) override {
    detail::check_buffer("all_reduce", send, count);
    detail::check_buffer("all_reduce", recv, count);
    detail::check_reducible("all_reduce", dtype, op);
    const int n = to_int("all_reduce", count);
    const std::int64_t es = dtype_size(dtype);
    auto [call, timer] = begin(OpKind::AllReduce, count * es, false);
    agree(call, detail::make_desc(call.seq, OpKind::AllReduce, count, dtype, op), *timer);
    const void* sbuf = send == recv ? MPI_IN_PLACE : send;
    if (is_half(dtype)) {
      auto scratch = std::make_shared<Scratch>(to_f32(send, count, dtype), count);
      std::vector<float>&s = scratch->send, &r = scratch->recv;
      run(call, [&](MPI_Request* q) {
        return MPI_Iallreduce(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_, q);
      }, [&] { return MPI_Allreduce(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_); },
          scratch);
      if (op == ReduceOp::Mean) detail::divide_inplace(r.data(), count, DType::F32, size_);
      from_f32(r, recv, dtype);
    } else {
      run(call, [&](MPI_Request* q) {
        return MPI_Iallreduce(sbuf, recv, n, mpi_type(dtype), mpi_op(op), comm_, q);
      }, [&] { return MPI_Allreduce(sbuf, recv, n, mpi_type(dtype), mpi_op(op), comm_); });
      if (op == ReduceOp::Mean) detail::divide_inplace(recv, count, dtype, size_);
    }
    end(call);
  }

  void all_gather(const void* send, void* recv, std::int64_t count, DType dtype) override {
    detail::check_buffer("all_gather", send, count);
    detail::check_buffer("all_gather", recv, count);
    const int n = to_int("all_gather", count * size_) / size_;
    const std::int64_t bytes = count * dtype_size(dtype);
    auto [call, timer] = begin(OpKind::AllGather, bytes, false);
    agree(call, detail::make_desc(call.seq, OpKind::AllGather, count, dtype), *timer);
    const void* sbuf = send == static_cast<char*>(recv) + rank_ * bytes ? MPI_IN_PLACE : send;
    run(call, [&](MPI_Request* q) {
      return MPI_Iallgather(sbuf, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, q);
    }, [&] { return MPI_Allgather(sbuf, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_); });
    end(call);
  }

  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) override {
    detail::check_buffer("reduce_scatter", send, count);
    detail::check_buffer("reduce_scatter", recv, count);
    detail::check_reducible("reduce_scatter", dtype, op);
    const int n = to_int("reduce_scatter", count * size_) / size_;
    auto [call, timer] = begin(OpKind::ReduceScatter, count * dtype_size(dtype), false);
    agree(call, detail::make_desc(call.seq, OpKind::ReduceScatter, count, dtype, op), *timer);
    if (is_half(dtype)) {
      auto scratch = std::make_shared<Scratch>(to_f32(send, count * size_, dtype), count);
      std::vector<float>&s = scratch->send, &r = scratch->recv;
      run(call, [&](MPI_Request* q) {
        return MPI_Ireduce_scatter_block(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_, q);
      }, [&] {
        return MPI_Reduce_scatter_block(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_);
      }, scratch);
      if (op == ReduceOp::Mean) detail::divide_inplace(r.data(), count, DType::F32, size_);
      from_f32(r, recv, dtype);
    } else {
      run(call, [&](MPI_Request* q) {
        return MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_, q);
      }, [&] {
        return MPI_Reduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_);
      });
      if (op == ReduceOp::Mean) detail::divide_inplace(recv, count, dtype, size_);
    }
    end(call);
  }

  void all_to_all(const void* send, void* recv, std::int64_t count, DType dtype) override {
    detail::check_buffer("all_to_all", send, count);
    detail::check_buffer("all_to_all", recv, count);
    DISTJAX_CHECK(send != recv || count == 0, InvalidArgument,
                  "[all_to_all] send and recv must be different buffers");
    const int n = to_int("all_to_all", count * size_) / size_;
    auto [call, timer] = begin(OpKind::AllToAll, count * dtype_size(dtype), false);
    agree(call, detail::make_desc(call.seq, OpKind::AllToAll, count, dtype), *timer);
    run(call, [&](MPI_Request* q) {
      return MPI_Ialltoall(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, q);
    }, [&] { return MPI_Alltoall(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_); });
    end(call);
  }

  void broadcast(void* buf, std::int64_t count, DType dtype, int root) override {
    detail::check_buffer("broadcast", buf, count);
    DISTJAX_CHECK(root >= 0 && root < size_, InvalidArgument, "[broadcast] root ", root,
                  " is out of range for a group of ", size_);
    const int n = to_int("broadcast", count);
    auto [call, timer] = begin(OpKind::Broadcast, count * dtype_size(dtype), rank_ == root);
    agree(call,
          detail::make_desc(call.seq, OpKind::Broadcast, count, dtype, ReduceOp::Sum, root),
          *timer);
    run(call, [&](MPI_Request* q) {
      return MPI_Ibcast(buf, n, mpi_type(dtype), root, comm_, q);
    }, [&] { return MPI_Bcast(buf, n, mpi_type(dtype), root, comm_); });
    end(call);
  }

  void permute(const void* send, void* recv, std::int64_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs) override {
    detail::check_buffer("permute", send, count);
    detail::check_buffer("permute", recv, count);
    DISTJAX_CHECK(send != recv || count == 0, InvalidArgument,
                  "[permute] send and recv must be different buffers");
    detail::check_pairs(pairs, size_);
    const int n = to_int("permute", count);
    const std::int64_t bytes = count * dtype_size(dtype);
    int src = -1, dst = -1;
    for (auto [s, d] : pairs) {
      if (d == rank_) src = s;
      if (s == rank_) dst = d;
    }
    // Bytes actually moved between devices (a self pair moves nothing).
    const bool sends = dst >= 0 && dst != rank_, receives = src >= 0 && src != rank_;
    auto [call, timer] = begin(
        OpKind::Permute,
        detail::Traffic{sends ? bytes : 0, receives ? bytes : 0, (sends || receives) ? 1 : 0});
    agree(call,
          detail::make_desc(call.seq, OpKind::Permute, count, dtype, ReduceOp::Sum, 0,
                            detail::hash_pairs(pairs)),
          *timer);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (src == rank_) {
      std::memcpy(recv, send, bytes);
    } else if (src >= 0) {
      check(MPI_Irecv(recv, n, mpi_type(dtype), src, kPermuteTag, comm_, &reqs[0]), "permute",
            global_);
    } else if (bytes > 0) {
      std::memset(recv, 0, bytes);
    }
    if (dst >= 0 && dst != rank_)
      check(MPI_Isend(send, n, mpi_type(dtype), dst, kPermuteTag, comm_, &reqs[1]), "permute",
            global_);
    wait_p2p(call, reqs, 2, data_deadline(call));
    end(call);
  }

  void barrier() override {
    auto [call, timer] = begin(OpKind::Barrier, 0, false);
    agree(call, detail::make_desc(call.seq, OpKind::Barrier), *timer);
    if (!opts_.check_collectives) {
      // The descriptor exchange is itself a barrier; without it use MPI's.
      run(call, [&](MPI_Request* q) { return MPI_Ibarrier(comm_, q); },
          [&] { return MPI_Barrier(comm_); });
    }
    end(call);
  }

  Request isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag) override {
    return post(true, const_cast<void*>(buf), count, dtype, dst, tag);
  }
  Request irecv(void* buf, std::int64_t count, DType dtype, int src, int tag) override {
    return post(false, buf, count, dtype, src, tag);
  }

  std::shared_ptr<CommunicatorImpl> split(int color, int key) override {
    DISTJAX_CHECK(color >= 0, InvalidArgument, "[split] color must be >= 0, got ", color);
    auto [call, timer] = begin(OpKind::Split, 0, false);
    agree(call, detail::make_desc(call.seq, OpKind::Split), *timer, /*force=*/true);
    // MPI has no nonblocking split: every rank has just agreed, so all are entering it;
    // the watchdog ends the job should one fail in between and leave the others blocked.
    MPI_Comm sub;
    const int rc = guarded(opts_.timeout, blocked_message("split", "MPI_Comm_split", global_,
                                                          opts_.timeout, where(call)),
                           [&] { return MPI_Comm_split(comm_, color, key, &sub); });
    check(rc, "split", global_);
    try {
      auto out = std::make_shared<MpiCommunicator>(sub, opts_, stats_, "split");
      end(call);
      return out;
    } catch (const CommError& e) {
      fail(e.what());
    }
  }

  /// A point-to-point transfer in flight.
  /// One collective call: its sequence number in the group, kind and deadline.
  struct CallInfo {
    std::uint64_t seq;
    OpKind kind;
    Clock::time_point deadline;
  };

  // Non-blocking collectives: the descriptor check (when on) at issue, then MPI_I*; the
  // request polls it against the timeout at wait(). Half-precision dtypes (converted
  // through f32 scratch) and groups of one run the blocking form.
  Request iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                      ReduceOp op) override {
    if (size_ == 1 || is_half(dtype)) {
      all_reduce(send, recv, count, dtype, op);
      return Request();
    }
    detail::check_buffer("iall_reduce", send, count);
    detail::check_buffer("iall_reduce", recv, count);
    detail::check_reducible("iall_reduce", dtype, op);
    const int n = to_int("iall_reduce", count);
    auto [call, timer] = begin(OpKind::AllReduce, count * dtype_size(dtype), false);
    agree(call, detail::make_desc(call.seq, OpKind::AllReduce, count, dtype, op), *timer);
    MPI_Request r;
    check(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_type(dtype), mpi_op(op),
                         comm_, &r),
          "iall_reduce", global_);
    std::function<void()> finish;
    if (op == ReduceOp::Mean)
      finish = [recv, count, dtype, k = size_] { detail::divide_inplace(recv, count, dtype, k); };
    return in_flight(call, std::move(timer), r, std::move(finish));
  }
  Request iall_gather(const void* send, void* recv, std::int64_t count, DType dtype) override {
    if (size_ == 1) {
      all_gather(send, recv, count, dtype);
      return Request();
    }
    detail::check_buffer("iall_gather", send, count);
    detail::check_buffer("iall_gather", recv, count);
    const int n = to_int("iall_gather", count * size_) / size_;
    const std::int64_t bytes = count * dtype_size(dtype);
    auto [call, timer] = begin(OpKind::AllGather, bytes, false);
    agree(call, detail::make_desc(call.seq, OpKind::AllGather, count, dtype), *timer);
    const void* sbuf = send == static_cast<char*>(recv) + rank_ * bytes ? MPI_IN_PLACE : send;
    MPI_Request r;
    check(MPI_Iallgather(sbuf, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, &r),
          "iall_gather", global_);
    return in_flight(call, std::move(timer), r, nullptr);
  }
  Request ireduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                          ReduceOp op) override {
    if (size_ == 1 || is_half(dtype)) {
      reduce_scatter(send, recv, count, dtype, op);
      return Request();
    }
    detail::check_buffer("ireduce_scatter", send, count);
    detail::check_buffer("ireduce_scatter", recv, count);
    detail::check_reducible("ireduce_scatter", dtype, op);
    const int n = to_int("ireduce_scatter", count * size_) / size_;
    auto [call, timer] = begin(OpKind::ReduceScatter, count * dtype_size(dtype), false);
    agree(call, detail::make_desc(call.seq, OpKind::ReduceScatter, count, dtype, op), *timer);
    MPI_Request r;
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_, &r),
          "ireduce_scatter", global_);
    std::function<void()> finish;
    if (op == ReduceOp::Mean)
      finish = [recv, count, dtype, k = size_] { detail::divide_inplace(recv, count, dtype, k); };
    return in_flight(call, std::move(timer), r, std::move(finish));
  }

  /// A non-blocking collective in flight: wait() polls it against the deadline and the
  /// abort channel, then finishes it (Mean's division) and closes its timer (stats).
  class CollectiveRequest final : public RequestImpl {
   public:
    CollectiveRequest(std::shared_ptr<MpiCommunicator> c, CallInfo call,
                      std::unique_ptr<detail::CallTimer> timer, MPI_Request r,
                      Clock::time_point deadline, std::function<void()> finish)
        : keep_(std::move(c)),
          c_(*keep_),
          call_(call),
          timer_(std::move(timer)),
          r_(r),
          deadline_(deadline),
          finish_(std::move(finish)) {}
    ~CollectiveRequest() override {
      // MPI cannot cancel a collective: one never waited on is completed here (bounded by
      // the deadline); a failure is already the group's.
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || r_ == MPI_REQUEST_NULL) return;
      try {
        wait();
      } catch (const std::exception&) {
      }
    }
    void wait() override {
      if (r_ == MPI_REQUEST_NULL) return;
      int done = 0;
      const WaitResult w = poll(&r_, &done, 1, deadline_, op_kind_name(call_.kind), c_.global_);
      if (w != WaitResult::Done) {
        r_ = MPI_REQUEST_NULL;  // abandoned with the group
        c_.fail(w == WaitResult::Aborted ? c_.abort_message(call_) : c_.stalled_message(call_));
      }
      complete();
    }
    bool test() override {
      if (r_ == MPI_REQUEST_NULL) return true;
      int flag = 0;
      check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), op_kind_name(call_.kind), c_.global_);
      if (flag) complete();
      return flag != 0;
    }

   private:
    void complete() {
      r_ = MPI_REQUEST_NULL;
      if (finish_) finish_();
      timer_.reset();
    }
    std::shared_ptr<MpiCommunicator> keep_;
    MpiCommunicator& c_;
    CallInfo call_;
    std::unique_ptr<detail::CallTimer> timer_;
    MPI_Request r_;
    Clock::time_point deadline_;
    std::function<void()> finish_;
  };

  class MpiRequest final : public RequestImpl {
   public:
    MpiRequest(std::shared_ptr<MpiCommunicator> c, MPI_Request r, bool is_send, int peer, int tag)
        : keep_(std::move(c)),
          c_(*keep_),
          r_(r),
          is_send_(is_send),
          peer_(peer),
          tag_(tag),
          stats_group_(c_.stats_group()) {}
    ~MpiRequest() override {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || r_ == MPI_REQUEST_NULL) return;
      MPI_Cancel(&r_);
      // A transfer already matched must finish; the watchdog bounds that wait.
      guarded(c_.opts_.timeout,
              blocked_message(is_send_ ? "isend" : "irecv", "MPI_Wait", c_.global_,
                              c_.opts_.timeout, " on a cancelled transfer in group " + c_.label_),
              [&] { return MPI_Wait(&r_, MPI_STATUS_IGNORE); });
    }
    void wait() override {
      const auto start = Clock::now();
      const auto deadline = start + c_.opts_.timeout;
      const char* name = is_send_ ? "isend" : "irecv";
      std::ostringstream os;
      int done = r_ == MPI_REQUEST_NULL ? 1 : 0;
      switch (poll(&r_, &done, 1, deadline, name, c_.global_)) {
        case WaitResult::Done: break;
        case WaitResult::TimedOut:
          os << "[" << name << "] timed out after " << c_.opts_.timeout.count() << " ms: device "
             << c_.global_ << (is_send_ ? " sending to" : " receiving from") << " device "
             << c_.members_[peer_] << " with tag " << tag_ << " in group " << c_.label_;
          throw CommError(os.str());
        case WaitResult::Aborted:
          os << "[" << name << "] transfer with device " << c_.members_[peer_] << " (tag " << tag_
             << ") in group " << c_.label_ << " abandoned: " << *poll_abort();
          throw CommError(os.str());
      }
      detail::count_wait(*c_.stats_, stats_group_, is_send_,
                         std::chrono::duration<double>(Clock::now() - start).count());
    }
    bool test() override {
      if (r_ == MPI_REQUEST_NULL) return true;
      int flag = 0;
      check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), is_send_ ? "isend" : "irecv", c_.global_);
      return flag != 0;
    }

   private:
    std::shared_ptr<MpiCommunicator> keep_;  // the request outlives no communicator
    MpiCommunicator& c_;
    MPI_Request r_;
    bool is_send_;
    int peer_, tag_;
    int stats_group_;  // the label in force when the transfer was posted
  };

 private:

  std::pair<CallInfo, std::unique_ptr<detail::CallTimer>> begin(OpKind kind,
                                                                std::int64_t block_bytes,
                                                                bool is_root) {
    return begin(kind, detail::ring_traffic(kind, block_bytes, size_, is_root));
  }
  /// A call whose traffic is not the ring algorithm's (permute: the bytes it moves).
  std::pair<CallInfo, std::unique_ptr<detail::CallTimer>> begin(OpKind kind,
                                                                const detail::Traffic& traffic) {
    if (failed_) throw CommError(failure_);
    if (poll_abort() != nullptr) {  // a device failed: start nothing new
      CallInfo c{seq_++, kind, Clock::now()};
      fail(abort_message(c));
    }
    CallInfo c{seq_++, kind, Clock::now() + opts_.timeout};
    return {c, std::make_unique<detail::CallTimer>(*this, kind, traffic)};
  }
  void end(const CallInfo&) {}

  Request in_flight(const CallInfo& call, std::unique_ptr<detail::CallTimer> timer, MPI_Request r,
                    std::function<void()> finish) {
    return Request(std::make_unique<CollectiveRequest>(shared_from_this(), call, std::move(timer),
                                                       r, data_deadline(call), std::move(finish)));
  }

  [[noreturn]] void fail(const std::string& msg) {
    failed_ = true;
    failure_ = msg;
    throw CommError(msg);
  }

  std::string timeout_message(const CallInfo& c, const std::vector<int>& missing_ranks) {
    std::ostringstream os;
    os << "[" << op_kind_name(c.kind) << "] timed out after " << opts_.timeout.count()
       << " ms at call #" << c.seq << " of group " << label_;
    if (!missing_ranks.empty()) {
      std::vector<int> devs;
      for (int r : missing_ranks) devs.push_back(members_[r]);
      os << ": " << (devs.size() == 1 ? "device " : "devices ") << detail::join_ints(devs)
         << " did not arrive";
    }
    return os.str();
  }

  /// " at call #k of group G".
  std::string where(const CallInfo& c) const {
    return " at call #" + std::to_string(c.seq) + " of group " + label_;
  }
  /// "[op] call #k of group G abandoned: device N failed: <its message>".
  std::string abort_message(const CallInfo& c) {
    const std::string* notice = poll_abort();
    std::ostringstream os;
    os << "[" << op_kind_name(c.kind) << "] call #" << c.seq << " of group " << label_
       << " abandoned: " << (notice ? *notice : std::string("another device failed"));
    return os.str();
  }
  /// Deadline of the transfer after the descriptor check: a fresh timeout once every rank
  /// has arrived and agreed, the call's own deadline when nothing was checked.
  Clock::time_point data_deadline(const CallInfo& c) const {
    return opts_.check_collectives && size_ > 1 ? Clock::now() + opts_.timeout : c.deadline;
  }
  std::string stalled_message(const CallInfo& c) {
    std::string msg = timeout_message(c, {});
    if (opts_.check_collectives && size_ > 1)
      msg += ": every device arrived and agreed, but the transfer did not complete (a device "
             "left the call?)";
    return msg;
  }

  /// Cancels the pending point-to-point requests of a call given up on, now: their
  /// buffers (the caller's, or locals of agree) must not be written after it throws.
  void cancel(const CallInfo& c, MPI_Request* reqs, const int* done, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (done[i] || reqs[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&reqs[i]);
      // An unmatched request completes at once; a matched one finishes its transfer.
      guarded(opts_.timeout,
              blocked_message(op_kind_name(c.kind), "MPI_Wait", global_, opts_.timeout,
                              " on a cancelled transfer in group " + label_),
              [&] { return MPI_Wait(&reqs[i], MPI_STATUS_IGNORE); });
    }
  }

  /// Waits for point-to-point requests (null ones are skipped); a timeout or an abort
  /// notice fails the group (the pending requests are cancelled with it).
  void wait_p2p(const CallInfo& c, MPI_Request* reqs, std::size_t n, Clock::time_point deadline) {
    std::vector<int> done(n);
    for (std::size_t i = 0; i < n; ++i) done[i] = reqs[i] == MPI_REQUEST_NULL;
    WaitResult w = poll(reqs, done.data(), n, deadline, op_kind_name(c.kind), global_);
    if (w == WaitResult::Done) return;
    cancel(c, reqs, done.data(), n);
    fail(w == WaitResult::Aborted ? abort_message(c) : stalled_message(c));
  }

  /// Exchanges this rank's descriptor with every other rank (on the private check
  /// communicator) and throws on mismatch or when some rank does not arrive in time.
  void agree(const CallInfo& c, const detail::CallDesc& mine, detail::CallTimer& timer,
             bool force = false) {
    if ((!opts_.check_collectives && !force) || size_ == 1) {
      timer.arrived();
      return;
    }
    std::vector<detail::CallDesc> all(size_);
    all[rank_] = mine;
    std::vector<MPI_Request> reqs;
    reqs.reserve(2 * size_);
    std::vector<int> recv_from;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      MPI_Request r;
      check(MPI_Irecv(&all[j], sizeof(detail::CallDesc), MPI_BYTE, j, kDescTag, check_comm_, &r),
            op_kind_name(c.kind), global_);
      reqs.push_back(r);
      recv_from.push_back(j);
    }
    const std::size_t num_recvs = reqs.size();
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      MPI_Request r;
      check(MPI_Isend(&mine, sizeof(detail::CallDesc), MPI_BYTE, j, kDescTag, check_comm_, &r),
            op_kind_name(c.kind), global_);
      reqs.push_back(r);
    }
    std::vector<int> done(reqs.size(), 0);
    WaitResult w = poll(reqs.data(), done.data(), reqs.size(), c.deadline, op_kind_name(c.kind),
                        global_);
    if (w != WaitResult::Done) {
      std::vector<int> missing;
      for (std::size_t i = 0; i < num_recvs; ++i)
        if (!done[i]) missing.push_back(recv_from[i]);
      cancel(c, reqs.data(), done.data(), reqs.size());
      fail(w == WaitResult::Aborted ? abort_message(c) : timeout_message(c, missing));
    }
    timer.arrived();
    std::string msg = detail::mismatch_message(all, members_);
    if (!msg.empty()) fail(msg);
  }

  /// Runs a collective in its nonblocking form, polled against the deadline and the
  /// abort channel: even after a successful descriptor exchange a rank must not block,
  /// since a peer may have failed the exchange at its own deadline (a race) and never
  /// enter. A request given up on is abandoned with the group (MPI cannot cancel a
  /// collective). Groups of one run the blocking form: nothing to wait for.
  template <class Start, class Blocking>
  void run(const CallInfo& c, Start&& start, Blocking&& blocking,
           std::shared_ptr<void> scratch = nullptr) {
    if (size_ == 1) {
      check(blocking(), op_kind_name(c.kind), global_);
      return;
    }
    const Clock::time_point deadline = data_deadline(c);
    MPI_Request r;
    check(start(&r), op_kind_name(c.kind), global_);
    int done = 0;
    WaitResult w = poll(&r, &done, 1, deadline, op_kind_name(c.kind), global_);
    if (w == WaitResult::Done) return;
    if (scratch) graveyard().push_back(std::move(scratch));  // MPI may still write there
    fail(w == WaitResult::Aborted ? abort_message(c) : stalled_message(c));
  }

  Request post(bool is_send, void* buf, std::int64_t count, DType dtype, int peer, int tag) {
    const char* name = is_send ? "isend" : "irecv";
    if (failed_) throw CommError(failure_);
    detail::check_buffer(name, buf, count);
    DISTJAX_CHECK(peer >= 0 && peer < size_, InvalidArgument, "[", name, "] peer rank ", peer,
                  " is out of range for group ", label_);
    DISTJAX_CHECK(tag >= 0 && tag < kMaxTag, InvalidArgument, "[", name, "] tag ", tag,
                  " is outside [0, ", kMaxTag, ")");
    const int n = to_int(name, count);
    detail::count_post(*this, is_send, count * dtype_size(dtype), peer == rank_);
    MPI_Request r;
    if (is_send) {
      check(MPI_Isend(buf, n, mpi_type(dtype), peer, tag, comm_, &r), name, global_);
    } else {
      check(MPI_Irecv(buf, n, mpi_type(dtype), peer, tag, comm_, &r), name, global_);
    }
    return Request(std::make_unique<MpiRequest>(shared_from_this(), r, is_send, peer, tag));
  }

  MPI_Comm comm_;
  MPI_Comm check_comm_ = MPI_COMM_NULL;
  LaunchOptions opts_;
  std::shared_ptr<CommStats> stats_;
  int rank_ = 0, size_ = 1, global_ = 0;
  std::vector<int> members_;
  std::string label_;
  std::uint64_t seq_ = 0;
  bool failed_ = false;
  std::string failure_;
};

namespace {
bool g_we_initialized = false;

// Every collective runs in its nonblocking form (so no rank can hang, see the top of this
// file). Open MPI's default choice for MPI_Iallreduce (libnbc) measured ~0.6x of the
// blocking MPI_Allreduce at 4 MiB on 2 ranks; its ring algorithm measured 1.4x at 4 MiB
// and 2.4x at 64 MiB (bench_comm). Open MPI reads MCA parameters from the environment
// at MPI_Init, which may happen in the user's main, so the default is set when the
// library loads; a value the user already set is kept.
const bool g_iallreduce_ring = [] {
  return setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0) == 0;
}();

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

}  // namespace distjax::comm::mpi

namespace distjax::comm::detail {

void launch_mpi(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    mpi::check(rc, "launch", -1);
    mpi::g_we_initialized = true;
    std::atexit(mpi::finalize_at_exit);
  }
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  DISTJAX_CHECK(opts.devices_per_process == 1, NotImplemented,
                "[launch] the MPI backend runs one device per process; devices_per_process=",
                opts.devices_per_process, " is not implemented");
  DISTJAX_CHECK(opts.num_devices <= 1 || opts.num_devices == world_size, ConfigError,
                "[launch] num_devices=", opts.num_devices, " but the MPI world has ", world_size,
                " processes x 1 device per process");
  DISTJAX_CHECK(opts.timeout.count() > 0, InvalidArgument, "[launch] timeout must be > 0 ms");
  set_intra_op_threads(intra_op_threads_for(opts, 1));
  mpi::open_epoch(opts.timeout, world_rank);
  try {
    auto world = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    MPI_Request r;
    mpi::check(MPI_Comm_idup(MPI_COMM_WORLD, world.get(), &r), "launch", world_rank);
    mpi::wait_setup(r, world, mpi::Clock::now() + opts.timeout, opts.timeout, "launch",
                    "duplicating MPI_COMM_WORLD", world_rank);
    Communicator c(std::make_shared<mpi::MpiCommunicator>(*world, opts,
                                                          std::make_shared<CommStats>(),
                                                          "launch"));
    fn(c);
  } catch (...) {
    // Tell the other processes first, so their pending calls fail now, not at timeout.
    std::exception_ptr e = std::current_exception();
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      mpi::send_abort(ex.what(), world_rank);
    } catch (...) {
      mpi::send_abort("a non-standard exception", world_rank);
    }
    mpi::close_epoch();
    rethrow_with_device(e, world_rank);
  }
  mpi::close_epoch();
}

bool mpi_available() { return true; }

}  // namespace distjax::comm::detail
