// Shared memory of the threads backend (see group_state.hpp).
#include "distjax/comm/threads/group_state.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

#include "distjax/core/error.hpp"

namespace distjax::comm::threads {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spinning before blocking only pays when every device has a core of its own.
constexpr int kSpinIterations = 4000;
constexpr auto kYieldTime = std::chrono::microseconds(200);

// Set on the workers of non-blocking collectives (GroupState::sleep_when_waiting).
thread_local bool t_sleep_when_waiting = false;

}  // namespace

void GroupState::sleep_when_waiting() {
  t_sleep_when_waiting = true;
}

// ---------------------------------------------------------------- WorldState

WorldState::WorldState(const LaunchOptions& opts)
    : n_(opts.num_devices),
      opts_(opts),
      latency_us_(opts.link.latency_us),
      bandwidth_gbps_(opts.link.bandwidth_gbps),
      exited_(new std::atomic<bool>[opts.num_devices]) {
  for (int d = 0; d < n_; ++d) {
    exited_[d].store(false);
    slots_.push_back(std::make_unique<Slot>());
  }
}

void WorldState::register_group(const std::shared_ptr<GroupState>& g) {
  std::lock_guard lk(mu_);
  // Drop groups that are gone so long runs with many splits do not grow the list.
  std::erase_if(groups_, [](const std::weak_ptr<GroupState>& w) { return w.expired(); });
  groups_.push_back(g);
}

void WorldState::abort_all(const std::string& why) {
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard lk(mu_);
    for (auto& w : groups_)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  for (auto& g : live) g->fail(why);
}

void WorldState::device_exited(int d) {
  exited_[d].store(true, std::memory_order_release);
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard lk(mu_);
    for (auto& w : groups_)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  // Wake waiters of groups that contain d so they notice at once.
  for (auto& g : live) {
    const auto& m = g->members();
    if (std::find(m.begin(), m.end(), d) != m.end()) g->fail("");
  }
}

void WorldState::enter_call(int d, OpKind op, std::uint64_t seq,
                            std::shared_ptr<const std::string> group) {
  Slot& s = *slots_[d];
  std::lock_guard lk(s.mu);
  s.busy = true;
  s.op = op;
  s.seq = seq;
  s.group = std::move(group);
}

void WorldState::leave_call(int d) {
  Slot& s = *slots_[d];
  std::lock_guard lk(s.mu);
  s.busy = false;
}

std::string WorldState::where_is(int d) {
  std::ostringstream os;
  os << "device " << d;
  if (exited(d)) {
    os << " finished its program";
    return os.str();
  }
  Slot& s = *slots_[d];
  std::lock_guard lk(s.mu);
  if (s.busy) {
    os << " is in " << op_kind_name(s.op) << " call #" << s.seq << " of group "
       << (s.group ? *s.group : std::string("?"));
  } else {
    os << " is not in a communicator call";
  }
  return os.str();
}

// ---------------------------------------------------------------- GroupState

GroupState::GroupState(std::shared_ptr<WorldState> world, std::vector<int> members)
    : world_(std::move(world)),
      members_(std::move(members)),
      label_(std::make_shared<const std::string>(detail::group_label(members_))),
      n_(static_cast<int>(members_.size())),
      spin_(n_ <= static_cast<int>(std::thread::hardware_concurrency())),
      entered_(new std::atomic<std::uint64_t>[members_.size()]),
      left_(members_.size(), false),
      desc_(n_),
      send_(n_, nullptr),
      recv_(n_, nullptr),
      aux0_(n_, 0),
      aux1_(n_, 0),
      marks_{std::vector<const tensor::raw::Event*>(n_, nullptr),
             std::vector<const tensor::raw::Event*>(n_, nullptr)},
      own_marks_(static_cast<std::size_t>(n_)),
      marks_made_(static_cast<std::size_t>(n_), 0) {
  for (int j = 0; j < n_; ++j) entered_[j].store(0);
}

void GroupState::order_after_marks(int rank) const {
  const auto& marks = marks_[(entered_[rank].load() - 1) % 2];
  for (const tensor::raw::Event* e : marks)
    if (e) e->stream_wait();
}

void GroupState::fail_locked(const std::string& why) {
  if (!why.empty() && !failed_) {
    failed_ = true;
    failure_ = why;
    failed_atomic_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void GroupState::fail(const std::string& why) {
  std::lock_guard lk(mu_);
  fail_locked(why);
}

void GroupState::check_alive() {
  if (!failed_atomic_.load(std::memory_order_acquire)) return;
  std::lock_guard lk(mu_);
  if (failed_) throw CommError(failure_);
}

std::vector<int> GroupState::missing_locked(int rank) const {
  std::vector<int> missing;
  for (int j = 0; j < n_; ++j)
    if (entered_[j].load() < entered_[rank].load()) missing.push_back(j);
  return missing;
}

bool GroupState::gives_up_locked(int rank, bool arrival) const {
  if (!failed_) return false;
  if (arrival) return true;
  for (int j : missing_locked(rank))
    if (left_[j]) return true;
  return false;
}

void GroupState::left_call(int rank) {
  std::lock_guard lk(mu_);
  left_[rank] = true;
  cv_.notify_all();
}

std::string GroupState::missing_message_locked(int rank, const std::vector<int>& missing,
                                               bool timeout) {
  const detail::CallDesc& d = desc_[rank];
  std::vector<int> devs;
  for (int j : missing) devs.push_back(members_[j]);
  std::ostringstream os;
  os << "[" << op_kind_name(static_cast<OpKind>(d.op)) << "] ";
  if (timeout) {
    os << "timed out after " << world_->options().timeout.count() << " ms at call #" << d.seq;
  } else {
    os << "cannot complete call #" << d.seq;
  }
  os << " of group " << *label_ << ": " << (devs.size() == 1 ? "device " : "devices ")
     << detail::join_ints(devs) << " did not arrive (";
  for (std::size_t i = 0; i < devs.size(); ++i) os << (i ? "; " : "") << world_->where_is(devs[i]);
  os << ")";
  return os.str();
}

void GroupState::sync(int rank, const detail::CallDesc* arrival, const void* send, void* recv,
                      int aux0, int aux1, Clock::time_point deadline,
                      const tensor::raw::Event* mark) {
  // A failure elsewhere (another device's error fails every group) ends an arrival at
  // once; a later sync point still meets its peers, which are moving data from and to
  // this rank's buffers and arrive without waiting on anything (gives_up_locked).
  if (arrival && failed_atomic_.load(std::memory_order_acquire)) {
    std::lock_guard lk(mu_);
    throw CommError(failure_);
  }
  if (arrival) {  // published by the release of the fetch_add below
    desc_[rank] = *arrival;
    send_[rank] = send;
    recv_[rank] = recv;
    aux0_[rank] = aux0;
    aux1_[rank] = aux1;
  }
  marks_[entered_[rank].load() % 2][rank] = mark;  // published like the arrival's values
  entered_[rank].fetch_add(1);
  // The phase cannot advance before this rank arrives, so this is the current one.
  const std::uint64_t my = phase_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
    arrived_.store(0, std::memory_order_relaxed);
    if (arrival) {
      std::string msg = detail::mismatch_message(desc_, members_);
      if (!msg.empty()) {
        std::lock_guard lk(mu_);
        fail_locked(msg);
        throw CommError(msg);
      }
    }
    phase_.store(my + 1);  // seq_cst, paired with the sleepers_ increment below
    if (sleepers_.load() > 0) {
      std::lock_guard lk(mu_);
      cv_.notify_all();
    }
    return;
  }
  if (spin_ && !t_sleep_when_waiting) {
    for (int i = 0; i < kSpinIterations; ++i) {
      if (phase_.load(std::memory_order_acquire) != my) return;
      if (failed_atomic_.load(std::memory_order_relaxed)) break;
      cpu_relax();
    }
    // Then yield for a bounded time: on a busy machine a sleeping thread can wait
    // milliseconds for a core once woken, while yielding lets the others run.
    const auto yield_until = Clock::now() + kYieldTime;
    for (int i = 0; !failed_atomic_.load(std::memory_order_relaxed); ++i) {
      if (phase_.load(std::memory_order_acquire) != my) return;
      std::this_thread::yield();
      if (i % 16 == 15 && Clock::now() > yield_until) break;
    }
  }
  std::unique_lock lk(mu_);
  sleepers_.fetch_add(1);
  struct Awake {
    std::atomic<int>& n;
    ~Awake() { n.fetch_sub(1); }
  } awake{sleepers_};
  for (;;) {
    if (phase_.load() != my) return;
    if (gives_up_locked(rank, arrival != nullptr)) throw CommError(failure_);
    // A missing device that finished its program can never arrive: fail now, naming it.
    std::vector<int> gone;
    for (int j : missing_locked(rank))
      if (world_->exited(members_[j])) gone.push_back(j);
    if (!gone.empty()) {
      std::string msg = missing_message_locked(rank, gone, false);
      fail_locked(msg);
      throw CommError(msg);
    }
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      if (phase_.load() != my) return;
      if (failed_) throw CommError(failure_);
      std::string msg = missing_message_locked(rank, missing_locked(rank), true);
      fail_locked(msg);
      throw CommError(msg);
    }
  }
}

std::shared_ptr<GroupState> GroupState::take_split(std::uint64_t seq, int color,
                                                   const std::vector<int>& members) {
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard lk(mu_);
    PendingSplit& p = splits_[{seq, color}];
    if (!p.group) {
      p.group = std::make_shared<GroupState>(world_, members);
      world_->register_group(p.group);  // lock order: group, then world
    }
    g = p.group;
    if (++p.taken == static_cast<int>(members.size())) splits_.erase({seq, color});
  }
  return g;
}

// ---------------------------------------------------------------- point-to-point

// Copies a paired message (s's send buffer into r's recv buffer) on the calling thread's
// stream of their device, after both posters' work before their posts, and marks the copy
// in both ops (on a GPU the host does not wait); returns the error, empty when it worked.
std::string GroupState::copy_message(P2POp& s, P2POp& r, const std::tuple<int, int, int>& key) {
  // One device kind on both sides (host memory and the checked device apart too, as in
  // the collectives: what a GPU could not serve fails on the CPU as well).
  const bool same = s.device.kind == r.device.kind &&
                    (s.device.kind != DeviceKind::CUDA || s.device == r.device);
  if (!same) {
    std::ostringstream os;
    os << "[send/recv] device " << members_[std::get<0>(key)] << " sends from "
       << s.device.str() << " but device " << members_[std::get<1>(key)] << " receives into "
       << r.device.str() << " (tag " << std::get<2>(key) << "): both buffers must be on one "
       << "device";
    return os.str();
  }
  try {
    s.ready.stream_wait();
    r.ready.stream_wait();
    const std::size_t bytes = static_cast<std::size_t>(s.count) * dtype_size(s.dtype);
    tensor::raw::copy("send/recv", s.device, r.recv_buf, s.send_buf, bytes);
    auto copied = std::make_shared<tensor::raw::Event>(
        tensor::raw::Event::record("send/recv", s.device));
    s.copied = r.copied = std::move(copied);  // published with `done`, under the lock
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void GroupState::post(int rank, const std::shared_ptr<P2POp>& op) {
  const Key key = op->is_send ? Key{rank, op->peer, op->tag} : Key{op->peer, rank, op->tag};
  std::shared_ptr<P2POp> other;
  {
    std::lock_guard lk(mu_);
    if (failed_) throw CommError(failure_);
    auto& opposite = op->is_send ? recvs_ : sends_;
    auto it = opposite.find(key);
    if (it != opposite.end() && !it->second.empty()) {
      other = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) opposite.erase(it);
      other->matched = op->matched = true;
    } else {
      (op->is_send ? sends_ : recvs_)[key].push_back(op);
      return;
    }
  }
  // Paired: copy outside the lock; neither side touches its buffer until `done`.
  P2POp& s = op->is_send ? *op : *other;
  P2POp& r = op->is_send ? *other : *op;
  std::string error;
  if (s.count != r.count || s.dtype != r.dtype) {
    std::ostringstream os;
    os << "[send/recv] device " << members_[std::get<1>(key)] << " expects " << r.count << " "
       << dtype_name(r.dtype) << " from device " << members_[std::get<0>(key)] << " with tag "
       << std::get<2>(key) << " but it sent " << s.count << " " << dtype_name(s.dtype);
    error = os.str();
  } else if (s.count > 0) {
    error = copy_message(s, r, key);
  }
  // One message step of the link model, counted from the match.
  const Clock::time_point ready =
      Clock::now() +
      detail::link_time(world_->link(),
                        detail::Traffic{.sent = static_cast<std::int64_t>(s.count * dtype_size(s.dtype)),
                                        .steps = 1});
  std::lock_guard lk(mu_);
  for (P2POp* p : {&s, &r}) {
    p->done = true;
    p->error = error;
    p->ready_at = ready;
  }
  cv_.notify_all();
}

void GroupState::wait(int rank, const std::shared_ptr<P2POp>& op, Clock::time_point deadline) {
  std::unique_lock lk(mu_);
  const char* name = op->is_send ? "isend" : "irecv";
  auto describe_wait = [&] {
    std::ostringstream os;
    os << "device " << members_[rank] << (op->is_send ? " sending " : " receiving ") << op->count
       << " " << dtype_name(op->dtype) << (op->is_send ? " to" : " from") << " device "
       << members_[op->peer] << " with tag " << op->tag << " in group " << *label_;
    return os.str();
  };
  while (!op->done) {
    if (failed_ && !op->matched) throw CommError(failure_);
    if (!op->matched && world_->exited(members_[op->peer])) {
      std::string msg = std::string("[") + name + "] " + describe_wait() + ": device " +
                         std::to_string(members_[op->peer]) +
                         " finished its program without the matching " +
                         (op->is_send ? "irecv" : "isend");
      lk.unlock();
      cancel(rank, op);
      fail(msg);
      throw CommError(msg);
    }
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !op->done && !op->matched) {
      std::string msg = std::string("[") + name + "] timed out after " +
                        std::to_string(world_->options().timeout.count()) + " ms: " +
                        describe_wait() + " (" + world_->where_is(members_[op->peer]) + ")";
      lk.unlock();
      cancel(rank, op);
      fail(msg);
      throw CommError(msg);
    }
  }
  if (!op->error.empty()) throw CommError(op->error);
  const auto ready = op->ready_at;
  lk.unlock();
  if (ready > Clock::now()) std::this_thread::sleep_until(ready);
}

bool GroupState::test(const std::shared_ptr<P2POp>& op) {
  std::lock_guard lk(mu_);
  if (!op->done) {
    if (failed_ && !op->matched) throw CommError(failure_);
    return false;
  }
  if (!op->error.empty()) throw CommError(op->error);
  return Clock::now() >= op->ready_at;
}

void GroupState::cancel(int rank, const std::shared_ptr<P2POp>& op) {
  std::unique_lock lk(mu_);
  if (!op->matched) {
    const Key key = op->is_send ? Key{rank, op->peer, op->tag} : Key{op->peer, rank, op->tag};
    auto& queues = op->is_send ? sends_ : recvs_;
    auto it = queues.find(key);
    if (it != queues.end()) {
      std::erase(it->second, op);
      if (it->second.empty()) queues.erase(it);
    }
    return;
  }
  cv_.wait(lk, [&] { return op->done; });  // the copy into / out of our buffer is running
}

}  // namespace distjax::comm::threads
