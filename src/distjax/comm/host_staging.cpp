// Device buffers staged through host memory for a host backend (see detail/host_staging.hpp).
#include "distjax/comm/detail/host_staging.hpp"

#include <optional>
#include <utility>

#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::detail {

namespace {

namespace raw = tensor::raw;

bool on_device(const Buffer& b) { return b.device.kind != DeviceKind::CPU && b.count > 0; }

/// One call's host copies: what the backend is given instead of the caller's device
/// buffers, and the copy back of the received one.
class Staging {
 public:
  /// Stages `send` (copied to the host now when copy_send) and `recv` (copied back by
  /// finish()). `recv` may be null (isend), and so may `send` (irecv).
  Staging(const char* op, const Buffer* send, const Buffer* recv, bool copy_send = true)
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
    if (copy_send)
      raw::to_host(op, send->device, send->data, host_send_.data,
                   static_cast<std::size_t>(send->bytes()));
  }
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
  bool copy_back_ = false;
};

/// A staged call in flight: completing the backend's request copies the result back.
/// The staging outlives the backend's request (declared first, destroyed last), which
/// waits for or cancels the transfer when dropped unfinished.
class StagedRequest final : public RequestImpl {
 public:
  StagedRequest(std::unique_ptr<Staging> staging, Request inner)
      : staging_(std::move(staging)), inner_(std::move(inner)) {}
  void wait() override {
    inner_.wait();
    staging_->finish();
  }
  bool test() override {
    if (!inner_.test()) return false;
    staging_->finish();
    return true;
  }

 private:
  std::unique_ptr<Staging> staging_;
  Request inner_;
};

class StagingCommunicator final : public CommunicatorImpl {
 public:
  explicit StagingCommunicator(std::shared_ptr<CommunicatorImpl> inner) : inner_(std::move(inner)) {
    CommunicatorImpl::set_label(inner_->label());
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int global_rank() const override { return inner_->global_rank(); }
  const std::vector<int>& group() const override { return inner_->group(); }
  CommStats& stats() override { return inner_->stats(); }
  void set_label(std::string_view label) override {
    CommunicatorImpl::set_label(label);
    inner_->set_label(label);
  }
  void set_link_model(const LinkModel& link) override { inner_->set_link_model(link); }

  Request iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op) override {
    if (!any_on_device(send, recv)) return inner_->iall_reduce(send, recv, op);
    auto st = std::make_unique<Staging>("iall_reduce", &send, &recv);
    Request r = inner_->iall_reduce(st->send(), st->recv(), op);
    return staged(std::move(st), std::move(r));
  }
  Request iall_gather(const Buffer& send, const Buffer& recv) override {
    if (!any_on_device(send, recv)) return inner_->iall_gather(send, recv);
    auto st = std::make_unique<Staging>("iall_gather", &send, &recv);
    Request r = inner_->iall_gather(st->send(), st->recv());
    return staged(std::move(st), std::move(r));
  }
  Request ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op) override {
    if (!any_on_device(send, recv)) return inner_->ireduce_scatter(send, recv, op);
    auto st = std::make_unique<Staging>("ireduce_scatter", &send, &recv);
    Request r = inner_->ireduce_scatter(st->send(), st->recv(), op);
    return staged(std::move(st), std::move(r));
  }
  void all_reduce(const Buffer& send, const Buffer& recv, ReduceOp op) override {
    if (!any_on_device(send, recv)) return inner_->all_reduce(send, recv, op);
    Staging st("all_reduce", &send, &recv);
    inner_->all_reduce(st.send(), st.recv(), op);
    st.finish();
  }
  void all_gather(const Buffer& send, const Buffer& recv) override {
    if (!any_on_device(send, recv)) return inner_->all_gather(send, recv);
    Staging st("all_gather", &send, &recv);
    inner_->all_gather(st.send(), st.recv());
    st.finish();
  }
  void reduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op) override {
    if (!any_on_device(send, recv)) return inner_->reduce_scatter(send, recv, op);
    Staging st("reduce_scatter", &send, &recv);
    inner_->reduce_scatter(st.send(), st.recv(), op);
    st.finish();
  }
  void all_to_all(const Buffer& send, const Buffer& recv) override {
    if (!any_on_device(send, recv)) return inner_->all_to_all(send, recv);
    Staging st("all_to_all", &send, &recv);
    inner_->all_to_all(st.send(), st.recv());
    st.finish();
  }
  void broadcast(const Buffer& buf, int root) override {
    if (!on_device(buf)) return inner_->broadcast(buf, root);
    // One block, both ways: the root's goes out, the others' come back.
    Staging st("broadcast", &buf, &buf, /*copy_send=*/rank() == root);
    inner_->broadcast(st.recv(), root);
    if (rank() != root) st.finish();
  }
  void permute(const Buffer& send, const Buffer& recv,
               const std::vector<std::pair<int, int>>& pairs) override {
    if (!any_on_device(send, recv)) return inner_->permute(send, recv, pairs);
    Staging st("permute", &send, &recv);
    inner_->permute(st.send(), st.recv(), pairs);
    st.finish();
  }
  void barrier() override { inner_->barrier(); }
  Request isend(const Buffer& buf, int dst, int tag) override {
    if (!on_device(buf)) return inner_->isend(buf, dst, tag);
    auto st = std::make_unique<Staging>("isend", &buf, nullptr);
    Request r = inner_->isend(st->send(), dst, tag);
    return staged(std::move(st), std::move(r));
  }
  Request irecv(const Buffer& buf, int src, int tag) override {
    if (!on_device(buf)) return inner_->irecv(buf, src, tag);
    auto st = std::make_unique<Staging>("irecv", nullptr, &buf);
    Request r = inner_->irecv(st->recv(), src, tag);
    return staged(std::move(st), std::move(r));
  }
  std::shared_ptr<CommunicatorImpl> split(int color, int key) override {
    return std::make_shared<StagingCommunicator>(inner_->split(color, key));
  }

 private:
  static bool any_on_device(const Buffer& a, const Buffer& b) { return on_device(a) || on_device(b); }
  static Request staged(std::unique_ptr<Staging> st, Request inner) {
    return Request(std::make_unique<StagedRequest>(std::move(st), std::move(inner)));
  }

  std::shared_ptr<CommunicatorImpl> inner_;
};

}  // namespace

std::shared_ptr<CommunicatorImpl> stage_device_buffers(std::shared_ptr<CommunicatorImpl> host_backend) {
  return std::make_shared<StagingCommunicator>(std::move(host_backend));
}

}  // namespace distjax::comm::detail
