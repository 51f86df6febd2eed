// The MPI backend: one process per device, launched by mpirun / srun. Collectives are
// MPI collectives; before each one the ranks exchange call descriptors point-to-point
// on a private duplicate communicator with a deadline, so a mismatch or a missing rank
// raises CommError naming the op and the ranks instead of hanging. Several devices per
// process are not implemented (devices_per_process must be 1).
// The C API only: OpenMPI's mpi.h pulls in its C++ bindings otherwise.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
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

}  // namespace

/// One process's handle on one MPI communicator.
class MpiCommunicator final : public CommunicatorImpl {
 public:
  MpiCommunicator(MPI_Comm comm, const LaunchOptions& opts, std::shared_ptr<CommStats> stats)
      : comm_(comm), opts_(opts), stats_(std::move(stats)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &global_);
    check(MPI_Comm_dup(comm_, &check_comm_), "launch", global_);
    MPI_Comm_set_errhandler(check_comm_, MPI_ERRORS_RETURN);
    members_.resize(size_);
    check(MPI_Allgather(&global_, 1, MPI_INT, members_.data(), 1, MPI_INT, comm_), "launch",
          global_);
    label_ = detail::group_label(members_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Request& r : stale_) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
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
    const int n = to_int("all_reduce", count);
    const std::int64_t es = dtype_size(dtype);
    auto [call, timer] = begin(OpKind::AllReduce, count * es, false);
    agree(call, detail::make_desc(call.seq, OpKind::AllReduce, count, dtype, op), *timer);
    const void* sbuf = send == recv ? MPI_IN_PLACE : send;
    if (is_half(dtype)) {
      std::vector<float> s = to_f32(send, count, dtype), r(count);
      run(call, [&](MPI_Request* q) {
        return MPI_Iallreduce(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_, q);
      }, [&] { return MPI_Allreduce(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_); });
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
    const int n = to_int("reduce_scatter", count * size_) / size_;
    auto [call, timer] = begin(OpKind::ReduceScatter, count * dtype_size(dtype), false);
    agree(call, detail::make_desc(call.seq, OpKind::ReduceScatter, count, dtype, op), *timer);
    if (is_half(dtype)) {
      std::vector<float> s = to_f32(send, count * size_, dtype), r(count);
      run(call, [&](MPI_Request* q) {
        return MPI_Ireduce_scatter_block(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_, q);
      }, [&] {
        return MPI_Reduce_scatter_block(s.data(), r.data(), n, MPI_FLOAT, mpi_op(op), comm_);
      });
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
    auto [call, timer] = begin(OpKind::Permute, 0, false);
    (*stats_)[OpKind::Permute].bytes_sent += (dst >= 0 && dst != rank_) ? bytes : 0;
    (*stats_)[OpKind::Permute].bytes_received += (src >= 0 && src != rank_) ? bytes : 0;
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
    for (MPI_Request& r : reqs) wait_one(call, r, [&] { return timeout_message(call, {}); });
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
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "split", global_);
    auto out = std::make_shared<MpiCommunicator>(sub, opts_, stats_);
    end(call);
    return out;
  }

  /// A point-to-point transfer in flight.
  class MpiRequest final : public RequestImpl {
   public:
    MpiRequest(MpiCommunicator& c, MPI_Request r, bool is_send, int peer, int tag)
        : c_(c), r_(r), is_send_(is_send), peer_(peer), tag_(tag) {}
    ~MpiRequest() override {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || r_ == MPI_REQUEST_NULL) return;
      MPI_Cancel(&r_);
      MPI_Wait(&r_, MPI_STATUS_IGNORE);
    }
    void wait() override {
      const auto start = Clock::now();
      const auto deadline = start + c_.opts_.timeout;
      const char* name = is_send_ ? "isend" : "irecv";
      int flag = 0;
      for (int spins = 0;; ++spins) {
        check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), name, c_.global_);
        if (flag) break;
        if (Clock::now() > deadline) {
          std::ostringstream os;
          os << "[" << name << "] timed out after " << c_.opts_.timeout.count() << " ms: device "
             << c_.global_ << (is_send_ ? " sending to" : " receiving from") << " device "
             << c_.members_[peer_] << " with tag " << tag_ << " in group " << c_.label_;
          throw CommError(os.str());
        }
        if (spins > 256) std::this_thread::yield();
      }
      OpCounters& cnt = (*c_.stats_)[is_send_ ? OpKind::Send : OpKind::Recv];
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      cnt.seconds += s;
      cnt.wait_seconds += s;
    }
    bool test() override {
      if (r_ == MPI_REQUEST_NULL) return true;
      int flag = 0;
      check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), is_send_ ? "isend" : "irecv", c_.global_);
      return flag != 0;
    }

   private:
    MpiCommunicator& c_;
    MPI_Request r_;
    bool is_send_;
    int peer_, tag_;
  };

 private:
  struct CallInfo {
    std::uint64_t seq;
    OpKind kind;
    Clock::time_point deadline;
  };

  std::pair<CallInfo, std::unique_ptr<detail::CallTimer>> begin(OpKind kind,
                                                                std::int64_t block_bytes,
                                                                bool is_root) {
    if (failed_) throw CommError(failure_);
    CallInfo c{seq_++, kind, Clock::now() + opts_.timeout};
    return {c, std::make_unique<detail::CallTimer>(
                   *stats_, kind, detail::ring_traffic(kind, block_bytes, size_, is_root))};
  }
  void end(const CallInfo&) {}

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

  /// Waits for one request until the call's deadline; a timeout fails the group.
  template <class Msg>
  void wait_one(const CallInfo& c, MPI_Request& r, Msg&& msg) {
    int flag = 0;
    for (int spins = 0; r != MPI_REQUEST_NULL; ++spins) {
      check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), op_kind_name(c.kind), global_);
      if (flag) return;
      if (Clock::now() > c.deadline) {
        stale_.push_back(r);
        r = MPI_REQUEST_NULL;
        fail(msg());
      }
      if (spins > 256) std::this_thread::yield();
    }
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
    for (int spins = 0;; ++spins) {
      int all_done = 1;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        if (done[i]) continue;
        check(MPI_Test(&reqs[i], &done[i], MPI_STATUS_IGNORE), op_kind_name(c.kind), global_);
        all_done &= done[i];
      }
      if (all_done) break;
      if (Clock::now() > c.deadline) {
        std::vector<int> missing;
        for (std::size_t i = 0; i < num_recvs; ++i)
          if (!done[i]) missing.push_back(recv_from[i]);
        for (std::size_t i = 0; i < reqs.size(); ++i)
          if (!done[i]) stale_.push_back(reqs[i]);
        fail(timeout_message(c, missing));
      }
      if (spins > 256) std::this_thread::yield();
    }
    timer.arrived();
    std::string msg = detail::mismatch_message(all, members_);
    if (!msg.empty()) fail(msg);
  }

  /// Runs a collective: blocking after a successful descriptor exchange (every rank has
  /// arrived and agreed, so it cannot hang on a mismatch), otherwise non-blocking with
  /// the call's deadline.
  template <class Start, class Blocking>
  void run(const CallInfo& c, Start&& start, Blocking&& blocking) {
    if (opts_.check_collectives || size_ == 1) {
      check(blocking(), op_kind_name(c.kind), global_);
      return;
    }
    MPI_Request r;
    check(start(&r), op_kind_name(c.kind), global_);
    wait_one(c, r, [&] { return timeout_message(c, {}); });
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
    OpCounters& cnt = (*stats_)[is_send ? OpKind::Send : OpKind::Recv];
    cnt.calls += 1;
    if (peer != rank_)
      (is_send ? cnt.bytes_sent : cnt.bytes_received) += count * dtype_size(dtype);
    MPI_Request r;
    if (is_send) {
      check(MPI_Isend(buf, n, mpi_type(dtype), peer, tag, comm_, &r), name, global_);
    } else {
      check(MPI_Irecv(buf, n, mpi_type(dtype), peer, tag, comm_, &r), name, global_);
    }
    return Request(std::make_unique<MpiRequest>(*this, r, is_send, peer, tag));
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
  std::vector<MPI_Request> stale_;
};

namespace {
bool g_we_initialized = false;
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
  MPI_Comm world;
  mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "launch", world_rank);
  try {
    Communicator c(std::make_shared<mpi::MpiCommunicator>(world, opts,
                                                          std::make_shared<CommStats>()));
    fn(c);
  } catch (...) {
    rethrow_with_device(std::current_exception(), world_rank);
  }
}

bool mpi_available() { return true; }

}  // namespace distjax::comm::detail
