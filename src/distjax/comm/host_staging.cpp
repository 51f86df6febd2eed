// Device buffers staged through host memory for a host backend (see detail/host_staging.hpp).
#include "distjax/comm/detail/host_staging.hpp"

#include <cstdlib>
#include <deque>
#include <functional>
#include <string_view>
#include <utility>

#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::detail {

namespace {

namespace raw = tensor::raw;

bool on_device(const Buffer& b) { return b.device.kind != DeviceKind::CPU && b.count > 0; }

/// How a Staging copies its send buffer to the host: at once (a blocking call), queued on
/// the calling thread's stream (a non-blocking one: sent() marks the copy), or not at all.
enum class SendCopy { Now, Queued, None };

/// One call's host copies: what the backend is given instead of the caller's device
/// buffers, and the copy back of the received one.
class Staging {
 public:
  /// Stages `send` (copied to the host as `copy` says) and `recv` (copied back by
  /// finish()). `recv` may be null (isend), and so may `send` (irecv).
  Staging(const char* op, const Buffer* send, const Buffer* recv, SendCopy copy = SendCopy::Now)
      : op_(op) {
    if (recv) {
      recv_ = *recv;
      host_recv_ = *recv;
      if (on_device(*recv)) {
        recv_block_ = raw::HostBlock(op, recv->device, static_cast<std::size_t>(recv->bytes()));
        host_recv_ = {recv_block_.data(), recv->count, recv->dtype, Device::cpu()};
        copy_back_ = true;
      }
    }
    if (!send) return;
    host_send_ = *send;
    if (!on_device(*send)) return;
    const char* s = static_cast<const char*>(send->data);
    const char* r = recv ? static_cast<const char*>(recv->data) : nullptr;
    const bool inside_recv = copy_back_ && send->device == recv->device && s >= r &&
                             s + send->bytes() <= r + recv->bytes();
    if (inside_recv) {  // in place: the send block is part of the host recv block
      host_send_ = {static_cast<char*>(recv_block_.data()) + (s - r), send->count, send->dtype,
                    Device::cpu()};
    } else {
      send_block_ = raw::HostBlock(op, send->device, static_cast<std::size_t>(send->bytes()));
      host_send_ = {send_block_.data(), send->count, send->dtype, Device::cpu()};
    }
    const auto bytes = static_cast<std::size_t>(send->bytes());
    if (copy == SendCopy::Now) {
      raw::to_host(op, send->device, send->data, host_send_.data, bytes);
    } else if (copy == SendCopy::Queued) {
      raw::to_host_async(op, send->device, send->data, host_send_.data, bytes);
      sent_ = raw::Event::record(op, send->device);
    }
  }
  /// Whether the queued copy of the send buffer is done (true when there is none), and
  /// the wait for it.
  bool sent() const { return sent_.done(); }
  void wait_sent() { sent_.wait(); }
  const Buffer& send() const { return host_send_; }
  const Buffer& recv() const { return host_recv_; }
  /// The call is complete: the received data goes back to the device (once).
  void finish() {
    if (!copy_back_) return;
    copy_back_ = false;
    raw::from_host(op_, recv_.device, host_recv_.data, recv_.data,
                   static_cast<std::size_t>(recv_.bytes()));
  }

 private:
  const char* op_;
  Buffer recv_{}, host_send_{}, host_recv_{};
  raw::HostBlock send_block_, recv_block_;
  raw::Event sent_;
  bool copy_back_ = false;
};

/// A non-blocking call whose host backend call starts once its send buffer is on the host.
/// The staging outlives the backend's request (declared first, destroyed last), which
/// waits for or cancels the transfer when dropped unfinished.
struct Deferred {
  std::unique_ptr<Staging> staging;
  std::function<Request(const Staging&)> start;  // the host backend's call
  Request inner;                                  // once started
  bool started = false;
};

/// A communicator's non-blocking calls not started yet, in issue order. They start in that
/// order (so every rank's backend sees its calls in issue order): the ones whose copy is
/// done whenever the communicator is used or a request polled, and all of them, waiting
/// for their copies, before a blocking call, or up to a request that is waited for.
class DeferredQueue {
 public:
  void push(std::shared_ptr<Deferred> d) {
    queue_.push_back(std::move(d));
    start_ready();
  }
  /// Starts the calls at the front whose send copies are done.
  void start_ready() {
    if (lazy_) return;
    while (!queue_.empty() && queue_.front()->staging->sent()) start_front();
  }
  /// Starts every call up to `last` (all with null), waiting for their copies.
  void start_through(const Deferred* last = nullptr) {
    while (!queue_.empty()) {
      const bool was_last = queue_.front().get() == last;
      start_front();
      if (was_last) return;
    }
  }

 private:
  void start_front() {
    std::shared_ptr<Deferred> d = std::move(queue_.front());
    queue_.pop_front();
    d->staging->wait_sent();
    d->inner = d->start(*d->staging);
    d->started = true;
  }
  std::deque<std::shared_ptr<Deferred>> queue_;
  // DISTJAX_STAGING_START=forced: calls start only when they must (a wait, a later
  // blocking call, a dropped request), as on a GPU whose copies are still running; the
  // tests use it to take the deferred path on devices whose copies finish at once.
  const bool lazy_ = [] {
    const char* e = std::getenv("DISTJAX_STAGING_START");
    return e && std::string_view(e) == "forced";
  }();
};

/// A staged non-blocking call: completing it (a wait, a test that returns true) starts it
/// if it has not started, completes the backend's request and copies the result back.
/// Dropped unfinished, it is started (its peers may have started theirs) and dropped.
class StagedRequest final : public RequestImpl {
 public:
  StagedRequest(std::shared_ptr<Deferred> d, std::shared_ptr<DeferredQueue> q)
      : d_(std::move(d)), q_(std::move(q)) {}
  ~StagedRequest() override {
    try {
      if (!d_->started) q_->start_through(d_.get());
    } catch (...) {  // dropped with the request, as a backend's own request drops its error
    }
  }
  void wait() override {
    q_->start_through(d_.get());
    d_->inner.wait();
    d_->staging->finish();
  }
  bool test() override {
    q_->start_ready();
    if (!d_->started || !d_->inner.test()) return false;
    d_->staging->finish();
    return true;
  }

 private:
  std::shared_ptr<Deferred> d_;
  std::shared_ptr<DeferredQueue> q_;
};

class StagingCommunicator final : public CommunicatorImpl {
 public:
  explicit StagingCommunicator(std::shared_ptr<CommunicatorImpl> inner)
      : CommunicatorImpl(inner->rank(), inner->group(), inner->shared_stats()),
        inner_(std::move(inner)) {
    CommunicatorImpl::set_label(inner_->label());
  }

  // The label is the inner backend's, which counts the calls.
  void set_label(std::string_view label) override {
    CommunicatorImpl::set_label(label);
    inner_->set_label(label);
  }
  void set_link_model(const LinkModel& link) override { inner_->set_link_model(link); }

  // A call on host buffers goes to the host backend once the calls before it have started.
  // On a device, a call the caller waits on at once (Completion::Now) copies and waits
  // here; any other is deferred until its send copy is done.
  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op,
                      Completion completion) override {
    if (!any_on_device(send, recv)) return in_order()->iall_reduce(send, recv, op, completion);
    return staged(completion, "all_reduce", "iall_reduce", &send, &recv,
                  [op](CommunicatorImpl& inner, const Staging& st, Completion c) {
                    return inner.iall_reduce(st.send(), st.recv(), op, c);
                  });
  }
  Request iall_gather(const Buffer& send, const Buffer& recv, Completion completion) override {
    if (!any_on_device(send, recv)) return in_order()->iall_gather(send, recv, completion);
    return staged(completion, "all_gather", "iall_gather", &send, &recv,
                  [](CommunicatorImpl& inner, const Staging& st, Completion c) {
                    return inner.iall_gather(st.send(), st.recv(), c);
                  });
  }
  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op,
                          Completion completion) override {
    if (!any_on_device(send, recv))
      return in_order()->ireduce_scatter(send, recv, op, completion);
    return staged(completion, "reduce_scatter", "ireduce_scatter", &send, &recv,
                  [op](CommunicatorImpl& inner, const Staging& st, Completion c) {
                    return inner.ireduce_scatter(st.send(), st.recv(), op, c);
                  });
  }
  Request iall_to_all(const Buffer& send, const Buffer& recv, Completion completion) override {
    if (!any_on_device(send, recv)) return in_order()->iall_to_all(send, recv, completion);
    return staged(completion, "all_to_all", "iall_to_all", &send, &recv,
                  [](CommunicatorImpl& inner, const Staging& st, Completion c) {
                    return inner.iall_to_all(st.send(), st.recv(), c);
                  });
  }
  Request iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                       const Buffer& recv, const std::vector<std::int64_t>& recv_counts,
                       Completion completion) override {
    if (!any_on_device(send, recv))
      return in_order()->iall_to_allv(send, send_counts, recv, recv_counts, completion);
    return staged(completion, "all_to_allv", "iall_to_allv", &send, &recv,
                  [send_counts, recv_counts](CommunicatorImpl& inner, const Staging& st,
                                             Completion c) {
                    return inner.iall_to_allv(st.send(), send_counts, st.recv(), recv_counts, c);
                  });
  }
  bool has_all_to_allv() const override { return inner_->has_all_to_allv(); }
  Request ibroadcast(const Buffer& buf, int root, Completion completion) override {
    if (!on_device(buf)) return in_order()->ibroadcast(buf, root, completion);
    // One block, both ways: the root's goes out, the others' come back.
    const bool now = completion == Completion::Now;
    const SendCopy copy = rank() != root ? SendCopy::None : now ? SendCopy::Now : SendCopy::Queued;
    auto st = std::make_unique<Staging>(now ? "broadcast" : "ibroadcast", &buf, &buf, copy);
    auto start = [root](CommunicatorImpl& inner, const Staging& s, Completion c) {
      return inner.ibroadcast(s.recv(), root, c);
    };
    if (!now) return deferred(std::move(st), start);
    start(*in_order(), *st, Completion::Now).wait();
    if (rank() != root) st->finish();
    return Request();
  }
  Request ipermute(const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs, Completion completion) override {
    if (!any_on_device(send, recv)) return in_order()->ipermute(send, recv, pairs, completion);
    return staged(completion, "permute", "ipermute", &send, &recv,
                  [pairs](CommunicatorImpl& inner, const Staging& st, Completion c) {
                    return inner.ipermute(st.send(), st.recv(), pairs, c);
                  });
  }
  void barrier() override { in_order()->barrier(); }
  // Messages keep their order too (MPI matches by order within a tag).
  Request isend(const Buffer& buf, int dst, int tag) override {
    if (!on_device(buf)) return in_order()->isend(buf, dst, tag);
    return deferred(std::make_unique<Staging>("isend", &buf, nullptr, SendCopy::Queued),
                    [dst, tag](CommunicatorImpl& inner, const Staging& st, Completion) {
                      return inner.isend(st.send(), dst, tag);
                    });
  }
  Request irecv(const Buffer& buf, int src, int tag) override {
    if (!on_device(buf)) return in_order()->irecv(buf, src, tag);
    return deferred(std::make_unique<Staging>("irecv", nullptr, &buf),
                    [src, tag](CommunicatorImpl& inner, const Staging& st, Completion) {
                      return inner.irecv(st.recv(), src, tag);
                    });
  }
  std::shared_ptr<CommunicatorImpl> split(int color, int key) override {
    return std::make_shared<StagingCommunicator>(in_order()->split(color, key));
  }

 private:
  static bool any_on_device(const Buffer& a, const Buffer& b) { return on_device(a) || on_device(b); }
  // The host backend, once every deferred call before this one has started.
  CommunicatorImpl* in_order() {
    queue_->start_through();
    return inner_.get();
  }
  /// A host backend's call on staged buffers, told how its caller completes it.
  using Start = std::function<Request(CommunicatorImpl& inner, const Staging&, Completion)>;

  /// A call of two buffers, one of them on a device. Completion::Now: the send buffer is
  /// copied at once, the call waited on, the result copied back; Later: deferred.
  Request staged(Completion completion, const char* blocking, const char* nonblocking,
                 const Buffer* send, const Buffer* recv, Start start) {
    if (completion == Completion::Later)
      return deferred(std::make_unique<Staging>(nonblocking, send, recv, SendCopy::Queued),
                      std::move(start));
    Staging st(blocking, send, recv);
    start(*in_order(), st, Completion::Now).wait();
    st.finish();
    return Request();
  }
  /// A non-blocking call started (with Completion::Later) once its send copy is done.
  Request deferred(std::unique_ptr<Staging> st, Start start) {
    auto d = std::make_shared<Deferred>();
    d->staging = std::move(st);
    d->start = [inner = inner_, start = std::move(start)](const Staging& s) {
      return start(*inner, s, Completion::Later);
    };
    queue_->push(d);
    return Request(std::make_unique<StagedRequest>(std::move(d), queue_));
  }

  std::shared_ptr<CommunicatorImpl> inner_;
  std::shared_ptr<DeferredQueue> queue_ = std::make_shared<DeferredQueue>();
};

}  // namespace

std::shared_ptr<CommunicatorImpl> stage_device_buffers(std::shared_ptr<CommunicatorImpl> host_backend) {
  return std::make_shared<StagingCommunicator>(std::move(host_backend));
}

}  // namespace distjax::comm::detail
