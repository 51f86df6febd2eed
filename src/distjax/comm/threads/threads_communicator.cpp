// The threads backend (see threads_communicator.hpp). Each collective is a few sync
// points on the group's shared state; between them every rank works on its own share
// (all_reduce: each rank folds its share of every send into every recv), so the work is
// split across devices.
// Nonblocking collectives run the same code on a worker thread of the device's group
// handle, in issue order (see ThreadsCommunicator::enqueue).
#include "distjax/comm/threads/threads_communicator.hpp"

#include <algorithm>
#include <bit>
#include <exception>
#include <optional>
#include <thread>

#include "distjax/core/error.hpp"
#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::threads {

namespace {

namespace raw = tensor::raw;


char* bytes_of(void* p) { return static_cast<char*>(p); }
const char* bytes_of(const void* p) { return static_cast<const char*>(p); }

raw::Reduction reduction_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return raw::Reduction::Sum;
    case ReduceOp::Mean: return raw::Reduction::Mean;
    case ReduceOp::Max: return raw::Reduction::Max;
  }
  return raw::Reduction::Sum;
}

// Where a call's data moves: the device of its buffers. Buffers that hold nothing do not
// count; the others must be of one device kind (one GPU for CUDA), else InvalidArgument
// naming the op and both devices. Host memory and the checked device are refused together
// too, though the CPU's kernels reach both: so the checked runs catch a call that mixes a
// tensor's buffer with host memory, which a GPU could not serve.
Device data_device(const char* op, std::initializer_list<const Buffer*> buffers) {
  const Buffer* first = nullptr;
  for (const Buffer* b : buffers) {
    if (b->count == 0) continue;
    if (!first) {
      first = b;
      continue;
    }
    const bool same = b->device.kind == first->device.kind &&
                      (b->device.kind != DeviceKind::CUDA || b->device == first->device);
    DISTJAX_CHECK(same, InvalidArgument, "[", op, "] expects its buffers on one device, got ",
                  first->device.str(), " and ", b->device.str());
  }
  return first ? first->device : Device::cpu();
}

// Elements [lo, hi) of rank r's share of count elements over n ranks.
std::pair<std::int64_t, std::int64_t> share(std::int64_t count, int n, int r) {
  return {count * r / n, count * (r + 1) / n};
}

}  // namespace

/// How one call of this device moves its data: through tensor::raw on its buffers' device
/// (memcpy and the CPU's reduction on the host; kernels on the calling thread's stream on a
/// GPU, where the device of every rank's buffers is one GPU shared by the simulated
/// devices, or GPUs of this process that reach each other).
///
/// On a GPU no sync point waits on the host: each rank publishes an event marking its work
/// before the sync point (at the arrival, `ready`: what wrote its buffers; later, what it
/// moved), and once through, every rank's stream waits on the device for every rank's mark.
/// So a rank's reads of its peers' buffers follow their writers, and its later work (which
/// may reuse its buffers) follows its peers' reads; the host only meets its peers.
struct ThreadsCommunicator::Mover {
  const char* op = "";
  Device device;
  /// The work this device queued before it issued the call (what wrote its send buffer,
  /// and what last used its recv buffer): the call waits for it before peers see them.
  raw::Event ready;

  Mover(const char* name, Device d) : op(name), device(d), ready(raw::Event::record(name, d)) {}
  void copy(void* dst, const void* src, std::int64_t bytes) const {
    if (bytes > 0) raw::copy(op, device, dst, src, static_cast<std::size_t>(bytes));
  }
  void zero(void* dst, std::int64_t bytes) const {
    if (bytes > 0) raw::zero(op, device, dst, static_cast<std::size_t>(bytes));
  }
  void reduce(void* dst, const std::vector<const void*>& srcs, std::int64_t n, DType dtype,
              ReduceOp r, int divisor) const {
    raw::reduce(op, device, dst, srcs.data(), static_cast<int>(srcs.size()), n, dtype,
                reduction_of(r), divisor);
  }
  /// The same fold written to every block of dsts in one pass.
  void reduce(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
              std::int64_t n, DType dtype, ReduceOp r, int divisor) const {
    raw::reduce(op, device, dsts.data(), static_cast<int>(dsts.size()), srcs.data(),
                static_cast<int>(srcs.size()), n, dtype, reduction_of(r), divisor);
  }
};

std::shared_ptr<ThreadsCommunicator::Mover> ThreadsCommunicator::mover(
    const char* op, std::initializer_list<const Buffer*> buffers) {
  return std::make_shared<Mover>(op, data_device(op, buffers));
}

/// One collective call: sequence number, deadline, flight-recorder entry and stats. Its
/// sync points order the data (see Mover): work after the arrival follows the work that
/// produced every rank's buffers, work after a phase or the departure follows what every
/// rank moved before it.
class ThreadsCommunicator::Call {
 public:
  Call(ThreadsCommunicator& c, Mover& m, OpKind kind, std::int64_t block_bytes,
       bool is_root = false)
      : Call(c, m, kind, detail::ring_traffic(kind, block_bytes, c.size(), is_root)) {}
  /// A call whose traffic is not the ring algorithm's (permute: the bytes it moves).
  Call(ThreadsCommunicator& c, Mover& m, OpKind kind, const detail::Traffic& traffic)
      : c_(c),
        m_(m),
        seq_(c.seq_++),
        traffic_(traffic),
        timer_(c, kind, traffic_, c.defer_,
               c.defer_ ? c.issued_ : std::chrono::steady_clock::now()),
        deadline_(Clock::now() + c.world_->options().timeout) {
    c_.world_->enter_call(c_.global_rank(), kind, seq_, c_.g_->label());
  }
  ~Call() {
    // Unwinding between the arrival and the last sync point: the peers waiting for this
    // rank there stop waiting once the group fails (GroupState::gives_up_locked).
    if (arrived_ && std::uncaught_exceptions() > exceptions_) c_.g_->left_call(c_.rank());
    c_.world_->leave_call(c_.global_rank());
  }
  std::uint64_t seq() const { return seq_; }
  Clock::time_point deadline() const { return deadline_; }
  /// Publishes the call (the descriptor names the device kind of its buffers: every rank's
  /// must agree) with the mover's `ready` event, waits for every rank, and orders this
  /// stream after every rank's `ready`. (A call whose mover marks nothing publishes no
  /// mark: such a call, a barrier or a split, may end with its arrival.)
  void arrive(detail::CallDesc d, const void* send, void* recv, int aux0 = 0, int aux1 = 0) {
    d.device = static_cast<std::uint8_t>(m_.device.kind);
    c_.g_->sync(c_.rank(), &d, send, recv, aux0, aux1, deadline_,
                m_.ready.empty() ? nullptr : &m_.ready);
    c_.g_->order_after_marks(c_.rank());
    arrived_ = true;
    timer_.arrived();
  }
  /// Charges the link model, then waits for every rank (nobody touches the buffers after).
  void depart() {
    c_.charge_link(traffic_);
    mark_and_sync();
  }
  void phase() { mark_and_sync(); }

 private:
  // Marks what this thread queued for the call so far, meets every rank, and orders the
  // stream after every rank's mark (the mark outlives the call: GroupState::next_mark).
  void mark_and_sync() {
    raw::Event& mark = c_.g_->next_mark(c_.rank());
    mark = raw::Event::record(m_.op, m_.device);
    c_.g_->sync(c_.rank(), nullptr, nullptr, nullptr, 0, 0, deadline_,
                mark.empty() ? nullptr : &mark);
    c_.g_->order_after_marks(c_.rank());
  }

  ThreadsCommunicator& c_;
  Mover& m_;
  std::uint64_t seq_;
  detail::Traffic traffic_;
  detail::CallTimer timer_;
  Clock::time_point deadline_;
  int exceptions_ = std::uncaught_exceptions();
  bool arrived_ = false;
};

ThreadsCommunicator::ThreadsCommunicator(std::shared_ptr<WorldState> world,
                                         std::shared_ptr<GroupState> group, int rank,
                                         std::shared_ptr<CommStats> stats)
    : CommunicatorImpl(rank, group->members(), std::move(stats)),
      world_(std::move(world)),
      g_(std::move(group)) {}

void ThreadsCommunicator::run_all_reduce(Mover& m, const Buffer& sb, const Buffer& rb,
                                         ReduceOp op) {
  const void* send = sb.data;
  void* recv = rb.data;
  const std::int64_t count = sb.count;
  const DType dtype = sb.dtype;
  const int n = size();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype));
  Call call(*this, m, OpKind::AllReduce, count * es);
  const auto d = detail::make_desc(call.seq(), OpKind::AllReduce, count, dtype, op);
  call.arrive(d, send, recv);
  std::vector<const void*> srcs(n);
  if (n == 1) {
    srcs[0] = send;
    m.reduce(recv, srcs, count, dtype, op, n);
  } else {
    // This rank folds its share (in rank order) and writes it into every rank's recv in the
    // same pass: the reads and writes of a reduce-scatter and an all-gather, without
    // writing the share and reading it back (8 buffer passes for 4 devices instead of 11),
    // and without the sync point between them. Only this rank touches its share of any
    // buffer, so in place is safe; the departure orders every rank after all the writes.
    auto [lo, hi] = share(count, n, rank());
    std::vector<void*> dsts(n);
    for (int j = 0; j < n; ++j) {
      srcs[j] = bytes_of(g_->send_of(j)) + lo * es;
      dsts[j] = bytes_of(g_->recv_of(j)) + lo * es;
    }
    m.reduce(dsts, srcs, hi - lo, dtype, op, n);
  }
  call.depart();
}

void ThreadsCommunicator::run_all_gather(Mover& m, const Buffer& sb, const Buffer& rb) {
  const void* send = sb.data;
  void* recv = rb.data;
  const std::int64_t count = sb.count;
  const DType dtype = sb.dtype;
  const int n = size();
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  Call call(*this, m, OpKind::AllGather, bytes);
  call.arrive(detail::make_desc(call.seq(), OpKind::AllGather, count, dtype), send, recv);
  for (int j = 0; j < n; ++j) {
    char* dst = bytes_of(recv) + j * bytes;
    if (dst != g_->send_of(j)) m.copy(dst, g_->send_of(j), bytes);
  }
  call.depart();
}

void ThreadsCommunicator::run_reduce_scatter(Mover& m, const Buffer& sb, const Buffer& rb,
                                             ReduceOp op) {
  const void* send = sb.data;
  void* recv = rb.data;
  const std::int64_t count = rb.count;
  const DType dtype = rb.dtype;
  const int n = size();
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  Call call(*this, m, OpKind::ReduceScatter, bytes);
  call.arrive(detail::make_desc(call.seq(), OpKind::ReduceScatter, count, dtype, op), send,
              recv);
  std::vector<const void*> srcs(n);
  for (int j = 0; j < n; ++j) srcs[j] = bytes_of(g_->send_of(j)) + rank() * bytes;
  m.reduce(recv, srcs, count, dtype, op, n);
  call.depart();
}

void ThreadsCommunicator::run_all_to_all(Mover& m, const Buffer& sb, const Buffer& rb) {
  const void* send = sb.data;
  void* recv = rb.data;
  const int n = size();
  const std::int64_t count = sb.count / n;
  const DType dtype = sb.dtype;
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  Call call(*this, m, OpKind::AllToAll, bytes);
  call.arrive(detail::make_desc(call.seq(), OpKind::AllToAll, count, dtype), send, recv);
  for (int j = 0; j < n; ++j)
    m.copy(bytes_of(recv) + j * bytes, bytes_of(g_->send_of(j)) + rank() * bytes, bytes);
  call.depart();
}

namespace {

// What a rank of an all_to_allv publishes at its arrival in place of its send pointer: its
// send buffer with the element offset of each destination's block, and its receive counts
// (so every rank can check every pair).
struct VariableSplits {
  const char* send = nullptr;
  std::vector<std::int64_t> send_counts, send_offsets, recv_counts;
};

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> at(counts.size(), 0);
  for (std::size_t j = 1; j < counts.size(); ++j) at[j] = at[j - 1] + counts[j - 1];
  return at;
}

}  // namespace

void ThreadsCommunicator::run_all_to_allv(Mover& m, const Buffer& sb,
                                          const std::vector<std::int64_t>& send_counts,
                                          const Buffer& rb,
                                          const std::vector<std::int64_t>& recv_counts) {
  const int n = size(), me = rank();
  const auto es = static_cast<std::int64_t>(dtype_size(sb.dtype));
  const VariableSplits mine{bytes_of(sb.data), send_counts, offsets_of(send_counts), recv_counts};
  // Bytes that cross between devices (a rank's block to itself moves nothing).
  detail::Traffic traffic{(sb.count - send_counts[me]) * es, (rb.count - recv_counts[me]) * es,
                          n - 1};
  Call call(*this, m, OpKind::AllToAll, traffic);
  call.arrive(detail::make_desc(call.seq(), OpKind::AllToAll, detail::kVariableCount, sb.dtype),
              &mine, rb.data);
  auto splits_of = [&](int r) { return static_cast<const VariableSplits*>(g_->send_of(r)); };
  // Every rank checks every pair, so all of them agree on the verdict; the phase keeps each
  // rank's published splits alive until every rank has read them.
  std::string disagree;
  for (int i = 0; i < n && disagree.empty(); ++i)
    for (int j = 0; j < n && disagree.empty(); ++j)
      if (splits_of(i)->send_counts[j] != splits_of(j)->recv_counts[i])
        disagree = "[all_to_allv] devices disagree at call #" + std::to_string(call.seq()) +
                   " of group " + *g_->label() + ": device " + std::to_string(group()[i]) +
                   " sends " + std::to_string(splits_of(i)->send_counts[j]) +
                   " elements to device " + std::to_string(group()[j]) + ", which expects " +
                   std::to_string(splits_of(j)->recv_counts[i]);
  if (!disagree.empty()) {
    call.phase();
    throw CommError(disagree);
  }
  std::int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    const VariableSplits& from = *splits_of(j);
    m.copy(bytes_of(rb.data) + at * es, from.send + from.send_offsets[me] * es,
           recv_counts[j] * es);
    at += recv_counts[j];
  }
  call.depart();
}

void ThreadsCommunicator::run_broadcast(Mover& m, const Buffer& b, int root) {
  void* buf = b.data;
  const std::int64_t count = b.count;
  const DType dtype = b.dtype;
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  Call call(*this, m, OpKind::Broadcast, bytes, rank() == root);
  call.arrive(detail::make_desc(call.seq(), OpKind::Broadcast, count, dtype, ReduceOp::Sum, root),
              buf, buf);
  if (rank() != root) m.copy(buf, g_->send_of(root), bytes);
  call.depart();
}

void ThreadsCommunicator::run_permute(Mover& m, const Buffer& sb, const Buffer& rb,
                                      const std::vector<std::pair<int, int>>& pairs) {
  const void* send = sb.data;
  void* recv = rb.data;
  const std::int64_t count = sb.count;
  const DType dtype = sb.dtype;
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  int src = -1;
  bool sends = false;
  for (auto [s, d] : pairs) {
    if (d == rank()) src = s;
    if (s == rank() && d != rank()) sends = true;
  }
  // Bytes actually moved between devices (a self pair moves nothing).
  const bool receives = src >= 0 && src != rank();
  Call call(*this, m, OpKind::Permute,
            detail::Traffic{sends ? bytes : 0, receives ? bytes : 0, (sends || src >= 0) ? 1 : 0});
  call.arrive(detail::make_desc(call.seq(), OpKind::Permute, count, dtype, ReduceOp::Sum, 0,
                                detail::hash_pairs(pairs)),
              send, recv);
  if (src >= 0) {
    m.copy(recv, g_->send_of(src), bytes);
  } else {
    m.zero(recv, bytes);
  }
  charge_link(detail::Traffic{sends ? bytes : 0, 0, (sends || src >= 0) ? 1 : 0});
  call.phase();
}

void ThreadsCommunicator::run_set_link_model(const LinkModel& link) {
  DISTJAX_CHECK(size() == world_->num_devices(), InvalidArgument,
                "[set_link_model] call it on the world communicator (every device of the "
                "launch); this group has ", size(), " of ", world_->num_devices(), " devices");
  Mover m("set_link_model", Device::cpu());
  Call call(*this, m, OpKind::Barrier, 0);
  // The model's bits in the descriptor: devices that pass different models disagree.
  const std::vector<std::pair<int, int>> bits = {
      {static_cast<int>(std::bit_cast<std::uint64_t>(link.latency_us) >> 32),
       static_cast<int>(std::bit_cast<std::uint64_t>(link.latency_us))},
      {static_cast<int>(std::bit_cast<std::uint64_t>(link.bandwidth_gbps) >> 32),
       static_cast<int>(std::bit_cast<std::uint64_t>(link.bandwidth_gbps))}};
  call.arrive(detail::make_desc(call.seq(), OpKind::Barrier, 0, DType::F32, ReduceOp::Sum, 0,
                                detail::hash_pairs(bits)),
              nullptr, nullptr);
  if (rank() == 0) world_->set_link(link);
  call.phase();
}

void ThreadsCommunicator::run_barrier() {
  Mover m("barrier", Device::cpu());
  Call call(*this, m, OpKind::Barrier, 0);
  call.arrive(detail::make_desc(call.seq(), OpKind::Barrier), nullptr, nullptr);
}

std::shared_ptr<CommunicatorImpl> ThreadsCommunicator::run_split(int color, int key) {
  const int n = size();
  Mover m("split", Device::cpu());
  Call call(*this, m, OpKind::Split, 0);
  call.arrive(detail::make_desc(call.seq(), OpKind::Split), nullptr, nullptr, color, key);
  std::vector<int> ranks;
  for (int j = 0; j < n; ++j)
    if (g_->aux0_of(j) == color) ranks.push_back(j);
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return g_->aux1_of(a) < g_->aux1_of(b); });
  std::vector<int> members;
  int my_rank = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    members.push_back(g_->members()[ranks[i]]);
    if (ranks[i] == rank()) my_rank = static_cast<int>(i);
  }
  auto sub = g_->take_split(call.seq(), color, members);
  call.phase();  // everyone has read the colors and keys
  return std::make_shared<ThreadsCommunicator>(world_, std::move(sub), my_rank, shared_stats());
}

namespace {

/// A transfer of the threads backend in flight.
class ThreadsRequest final : public RequestImpl {
 public:
  ThreadsRequest(std::shared_ptr<GroupState> g, int rank, std::shared_ptr<P2POp> op,
                 std::shared_ptr<CommStats> stats, int stats_group,
                 std::chrono::milliseconds timeout)
      : g_(std::move(g)),
        rank_(rank),
        op_(std::move(op)),
        stats_(std::move(stats)),
        stats_group_(stats_group),
        timeout_(timeout) {}
  ~ThreadsRequest() override {
    if (finished_) return;
    g_->cancel(rank_, op_);
    try {
      if (op_->copied) op_->copied->stream_wait();  // matched: the buffer may be freed next
    } catch (...) {  // a device error: dropped with the request, as its other errors are
    }
  }
  void wait() override {
    if (finished_) return;
    auto start = Clock::now();
    g_->wait(rank_, op_, start + timeout_);
    finish();
    detail::count_wait(*stats_, stats_group_, op_->is_send,
                       std::chrono::duration<double>(Clock::now() - start).count());
  }
  bool test() override {
    if (finished_) return true;
    if (!g_->test(op_)) return false;
    finish();
    return true;
  }

 private:
  // The copy is done (or, on a GPU, this thread's stream is ordered after it): the buffer
  // is the caller's again.
  void finish() {
    finished_ = true;
    if (op_->copied) op_->copied->stream_wait();
  }

  std::shared_ptr<GroupState> g_;
  int rank_;
  std::shared_ptr<P2POp> op_;
  std::shared_ptr<CommStats> stats_;
  int stats_group_;  // the label in force when the transfer was posted
  std::chrono::milliseconds timeout_;
  bool finished_ = false;
};

}  // namespace

Request ThreadsCommunicator::post(bool is_send, const Buffer& b, int peer, int tag) {
  void* buf = b.data;
  const std::int64_t count = b.count;
  const DType dtype = b.dtype;
  auto op = std::make_shared<P2POp>();
  op->is_send = is_send;
  if (is_send) {
    op->send_buf = buf;
  } else {
    op->recv_buf = buf;
  }
  op->count = count;
  op->dtype = dtype;
  op->peer = peer;
  op->tag = tag;
  // Whoever pairs the two sides copies, on its own thread: it waits for the work this
  // device queued before posting (what wrote the send buffer or last used the recv one).
  op->device = data_device(is_send ? "isend" : "irecv", {&b});
  op->ready = raw::Event::record(is_send ? "isend" : "irecv", op->device);
  detail::count_post(*this, is_send, count * static_cast<std::int64_t>(dtype_size(dtype)),
                     peer == rank());
  g_->post(rank(), op);
  return Request(std::make_unique<ThreadsRequest>(g_, rank(), std::move(op), shared_stats(),
                                                  stats_group(), world_->options().timeout));
}

Request ThreadsCommunicator::isend(const Buffer& buf, int dst, int tag) {
  return post(true, buf, dst, tag);
}

Request ThreadsCommunicator::irecv(const Buffer& buf, int src, int tag) {
  return post(false, buf, src, tag);
}

// ---------------------------------------------------------------- nonblocking collectives

void ThreadsCommunicator::charge_link(const detail::Traffic& traffic) {
  const LinkModel link = world_->link();
  if (!link.enabled()) return;
  // The transfer starts when the link is free (after the calls before it on this group).
  link_free_ = std::max(link_free_, Clock::now()) + detail::link_time(link, traffic);
  if (link_ready_) {
    *link_ready_ = link_free_;  // the request's wait sleeps until then
  } else {
    std::this_thread::sleep_until(link_free_);
  }
}

struct ThreadsCommunicator::Job {
  std::function<void()> fn;
  std::shared_ptr<Mover> mover;  // how fn moves data (none: a barrier, a split)
  raw::Event done_mark;           // recorded by the worker after fn's device work
  Clock::time_point issued = Clock::now();
  Clock::time_point ready_at{};  // link model: when the data would have arrived
  detail::DeferredCount count;  // written by the worker before `done`
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
};

/// A collective queued on the worker. Completing it (wait, a true test, or destruction)
/// adds its counters to the device's stats, on the device's thread.
class ThreadsCommunicator::CollectiveRequest final : public RequestImpl {
 public:
  CollectiveRequest(std::shared_ptr<Job> job, std::shared_ptr<CommStats> stats, int group)
      : job_(std::move(job)), stats_(std::move(stats)), group_(group) {}
  ~CollectiveRequest() override {
    if (finished_) return;
    // Peers may be reading or writing our buffers: wait (each call is bounded by the
    // timeout); the error, if any, is dropped with the request.
    std::unique_lock lk(job_->mu);
    job_->cv.wait(lk, [&] { return job_->done; });
    lk.unlock();
    try {
      job_->done_mark.stream_wait();  // the buffers may be freed next, on this stream
    } catch (...) {  // a device error: dropped with the request, as its other errors are
    }
    job_->count.apply(*stats_, group_);
  }
  void wait() override {
    if (finished_) return;
    {
      std::unique_lock lk(job_->mu);
      job_->cv.wait(lk, [&] { return job_->done; });
    }
    if (!job_->error) std::this_thread::sleep_until(job_->ready_at);  // the link's time
    finish();
  }
  // Completing orders this thread's stream after the device work the worker queued for
  // the call (on a GPU: on the device, without a host wait).
  bool test() override {
    if (finished_) return true;
    {
      std::lock_guard lk(job_->mu);
      if (!job_->done) return false;
    }
    if (!job_->error && Clock::now() < job_->ready_at) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    finished_ = true;
    job_->done_mark.stream_wait();
    job_->count.apply(*stats_, group_);
    if (job_->error) std::rethrow_exception(job_->error);
  }
  std::shared_ptr<Job> job_;
  std::shared_ptr<CommStats> stats_;
  int group_;  // the label in force when the call was issued
  bool finished_ = false;
};

ThreadsCommunicator::~ThreadsCommunicator() {
  {
    std::lock_guard lk(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // the worker drains the queue first
}

// A thread's GPU stream (CUDA's per-thread stream) is torn down when the thread ends. Where
// it still has work queued, several processes sharing one GPU hang in that teardown: on an
// H200, each device thread of a process stuck for good in the driver's thread-exit
// destructor, the launch never returning (gpu_spmd_mpi; two processes of the collectives'
// tests without MPI too). So a thread that ran device work waits for it before it ends
// (quietly: after the error that ended the thread, or in a destructor).
void finish_thread_work(Device device) {
  try {
    tensor::raw::synchronize("thread exit", device);
  } catch (const std::exception&) {
  }
}

void ThreadsCommunicator::worker_loop() {
  GroupState::sleep_when_waiting();  // the device's thread computes meanwhile
  std::optional<Device> used;        // the device this thread queued work on
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(q_mu_);
      q_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        lk.unlock();
        if (used) finish_thread_work(*used);
        return;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (job->mover) used = job->mover->device;
    defer_ = &job->count;
    issued_ = job->issued;
    link_ready_ = &job->ready_at;
    try {
      job->fn();
      if (job->mover) job->done_mark = raw::Event::record(job->mover->op, job->mover->device);
    } catch (...) {
      job->error = std::current_exception();
    }
    job->fn = nullptr;  // with it the host access to the buffers, before anyone can free them
    job->mover = nullptr;
    defer_ = nullptr;
    link_ready_ = nullptr;
    {
      std::lock_guard lk(job->mu);
      job->done = true;
    }
    job->cv.notify_all();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

Request ThreadsCommunicator::enqueue(std::shared_ptr<Mover> m, std::function<void()> fn) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  job->mover = std::move(m);
  {
    std::lock_guard lk(q_mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    pending_.fetch_add(1, std::memory_order_acq_rel);
    queue_.push_back(job);
  }
  q_cv_.notify_one();
  return Request(
      std::make_unique<CollectiveRequest>(std::move(job), shared_stats(), stats_group()));
}

void ThreadsCommunicator::in_order(std::shared_ptr<Mover> m, std::function<void()> fn) {
  // Only this device's thread adds jobs, so once the count is 0 it stays 0 here.
  if (pending_.load(std::memory_order_acquire) == 0) return fn();
  enqueue(std::move(m), std::move(fn)).wait();
}

template <class Fn>
Request ThreadsCommunicator::issue(Completion completion, std::shared_ptr<Mover> m, Fn&& fn) {
  if (completion == Completion::Later) return enqueue(std::move(m), std::forward<Fn>(fn));
  // Waited on before this returns: fn may stay on this stack (a reference, no allocation).
  in_order(std::move(m), std::ref(fn));
  return Request();
}

// Each entry finds its buffers' device (refusing buffers on two devices, naming the op)
// and marks the work this device queued before the call, on this thread; a non-blocking
// call's job keeps its mover until the call is done (so fn holds a plain pointer to it, and
// a blocking call costs no reference count). The op's name in errors is its
// blocking form's when the caller waits at once (the front's all_reduce is
// iall_reduce(..., Completion::Now).wait()).
namespace {
const char* op_name(Completion completion, const char* blocking, const char* nonblocking) {
  return completion == Completion::Now ? blocking : nonblocking;
}
}  // namespace

Request ThreadsCommunicator::iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op,
                                         Completion completion) {
  auto m = mover(op_name(completion, "all_reduce", "iall_reduce"), {&send, &recv});
  return issue(completion, m,
               [this, mv = m.get(), send, recv, op] { run_all_reduce(*mv, send, recv, op); });
}
Request ThreadsCommunicator::iall_gather(const Buffer& send, const Buffer& recv,
                                         Completion completion) {
  auto m = mover(op_name(completion, "all_gather", "iall_gather"), {&send, &recv});
  return issue(completion, m,
               [this, mv = m.get(), send, recv] { run_all_gather(*mv, send, recv); });
}
Request ThreadsCommunicator::ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                                             Completion completion) {
  auto m = mover(op_name(completion, "reduce_scatter", "ireduce_scatter"), {&send, &recv});
  return issue(completion, m,
               [this, mv = m.get(), send, recv, op] { run_reduce_scatter(*mv, send, recv, op); });
}
Request ThreadsCommunicator::iall_to_all(const Buffer& send, const Buffer& recv,
                                         Completion completion) {
  auto m = mover(op_name(completion, "all_to_all", "iall_to_all"), {&send, &recv});
  return issue(completion, m,
               [this, mv = m.get(), send, recv] { run_all_to_all(*mv, send, recv); });
}
Request ThreadsCommunicator::iall_to_allv(const Buffer& send,
                                          const std::vector<std::int64_t>& send_counts,
                                          const Buffer& recv,
                                          const std::vector<std::int64_t>& recv_counts,
                                          Completion completion) {
  auto m = mover(op_name(completion, "all_to_allv", "iall_to_allv"), {&send, &recv});
  return issue(completion, m, [this, mv = m.get(), send, recv, send_counts, recv_counts] {
    run_all_to_allv(*mv, send, send_counts, recv, recv_counts);
  });
}
Request ThreadsCommunicator::ibroadcast(const Buffer& buf, int root, Completion completion) {
  auto m = mover(op_name(completion, "broadcast", "ibroadcast"), {&buf});
  return issue(completion, m, [this, mv = m.get(), buf, root] { run_broadcast(*mv, buf, root); });
}
Request ThreadsCommunicator::ipermute(const Buffer& send, const Buffer& recv,
                                      const std::vector<std::pair<int, int>>& pairs,
                                      Completion completion) {
  auto m = mover(op_name(completion, "permute", "ipermute"), {&send, &recv});
  return issue(completion, m,
               [this, mv = m.get(), send, recv, pairs] { run_permute(*mv, send, recv, pairs); });
}
void ThreadsCommunicator::barrier() {
  in_order(nullptr, [&] { run_barrier(); });
}
void ThreadsCommunicator::set_link_model(const LinkModel& link) {
  in_order(nullptr, [&] { run_set_link_model(link); });
}
std::shared_ptr<CommunicatorImpl> ThreadsCommunicator::split(int color, int key) {
  DISTJAX_CHECK(color >= 0, InvalidArgument, "[split] color must be >= 0, got ", color);
  std::shared_ptr<CommunicatorImpl> out;
  in_order(nullptr, [&] { out = run_split(color, key); });
  return out;
}

}  // namespace distjax::comm::threads
