// Request: the handle of an asynchronous transfer (isend / irecv) or nonblocking
// collective (iall_reduce, iall_gather, ireduce_scatter).
#pragma once

#include <memory>

namespace distjax::comm {

/// Backend side of a Request.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  /// Blocks until the transfer is complete; throws CommError on timeout or failure.
  virtual void wait() = 0;
  /// True when complete (never blocks); throws CommError if the transfer failed.
  virtual bool test() = 0;
};

/// A transfer or collective in flight. The buffers given to the call must stay alive and
/// untouched until wait() returns or test() returns true. Move-only. Destroying a
/// point-to-point request that was never completed cancels it if it has not been matched
/// yet, and otherwise waits for it; destroying a collective's request waits for it
/// (errors are then dropped: call wait() to see them).
///
///   Request r = comm.irecv(buf, n, DType::F32, /*src=*/left, /*tag=*/0);
///   compute_something();   // the transfer proceeds meanwhile
///   r.wait();
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  ~Request() = default;

  /// Blocks until complete (no-op on an empty or completed request).
  void wait() {
    if (impl_) impl_->wait();
  }
  /// Whether the transfer has completed (true for an empty request).
  bool test() { return impl_ ? impl_->test() : true; }
  bool valid() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<RequestImpl> impl_;
};

}  // namespace distjax::comm
