// Asynchronous, differentiable point-to-point. The op is recorded as two tape nodes: the
// start node (input x, output a scalar token) and the done node (input the token, output
// the received tensor). The tape runs nodes in reverse creation order, so in the backward
// pass the done node comes first (it starts the reverse transfer) and the start node
// later (it waits for it), with the backward of everything computed in between
// overlapping the transfer, mirroring the forward pass.
#include "distjax/spmd/ppermute.hpp"

#include <set>
#include <string>

#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/detail/named.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::spmd {

namespace detail {

// Tags of the spmd layer's point-to-point traffic: forward and backward transfers are
// matched separately, so interleavings like a pipeline's 1F1B cannot cross them.
constexpr int kForwardTag = comm::kMaxTag - 1;
constexpr int kBackwardTag = comm::kMaxTag - 2;

struct PermuteState {
  comm::Communicator comm;
  DeviceContext* ctx = nullptr;
  std::string axes;      // for messages
  int send_to = -1;      // group rank this device sends to (-1: none)
  int recv_from = -1;    // group rank this device receives from (-1: none)
  Shape shape;
  DType dtype = DType::F32;
  std::uint32_t vma = 0;
  bool done = false;
  // Forward transfer (buffers owned here until done).
  tensor::Tensor send_buf, recv_buf;
  comm::Request send_req, recv_req;
  // Backward transfer.
  tensor::Tensor grad_send, grad_recv;
  comm::Request grad_send_req, grad_recv_req;
  tensor::Tensor token;  // start node output (carries the tape edge to x)
};

}  // namespace detail

namespace {

using detail::PermuteState;
using tensor::Tensor;

template <class F>
void named(const PermuteState& s, const char* op, F&& f) {
  detail::named(op, s.axes, std::forward<F>(f));
}

// Transpose, first half (at the done node): send this device's cotangent back to where
// its value came from and post the receive of the cotangent of what it sent.
void start_backward(PermuteState& s, const Tensor& g) {
  ++s.ctx->counters().collective_calls["ppermute.T"];
  named(s, "ppermute transpose", [&] {
    if (s.send_to >= 0) {
      s.grad_recv = Tensor::empty(s.shape, s.dtype);
      s.grad_recv_req = s.comm.irecv(comm::buffer_of(s.grad_recv), s.send_to, detail::kBackwardTag);
    }
    if (s.recv_from >= 0) {
      s.grad_send = g.defined() ? g : Tensor::zeros(s.shape, s.dtype);
      s.grad_send_req =
          s.comm.isend(comm::buffer_of(s.grad_send), s.recv_from, detail::kBackwardTag);
    }
  });
}

// Transpose, second half (at the start node): the cotangent of x.
Tensor finish_backward(PermuteState& s) {
  named(s, "ppermute transpose", [&] {
    s.grad_recv_req.wait();
    s.grad_send_req.wait();
  });
  s.grad_send = Tensor();
  Tensor g = s.send_to >= 0 ? s.grad_recv : Tensor::zeros(s.shape, s.dtype);
  s.grad_recv = Tensor();
  return g;
}

}  // namespace

PermuteHandle ppermute_start(DeviceContext& ctx, const Tensor& x_in, const Axes& axes,
                             const std::vector<std::pair<int, int>>& perm) {
  tensor::check_defined(x_in, "ppermute", "x");
  comm::Communicator c = ctx.comm(axes);
  const int n = c.size();
  const int me = c.rank();
  auto s = std::make_shared<PermuteState>();
  std::set<int> srcs, dsts;
  for (const auto& [src, dst] : perm) {
    DISTJAX_CHECK(src >= 0 && src < n && dst >= 0 && dst < n, ShardingError, "[ppermute] pair (",
                  src, ", ", dst, ") out of range for ", axes.str(), "=", n, " in mesh ",
                  ctx.mesh().describe());
    DISTJAX_CHECK(srcs.insert(src).second && dsts.insert(dst).second, ShardingError,
                  "[ppermute] index appears twice as source or destination in pair (", src, ", ",
                  dst, ")");
    if (src == me) s->send_to = dst;
    if (dst == me) s->recv_from = src;
  }
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose takes per-device cotangents
  ++ctx.counters().collective_calls["ppermute"];
  s->comm = c;
  s->ctx = &ctx;
  s->axes = axes.str();
  s->shape = x.shape();
  s->dtype = x.dtype();
  s->vma = x.varying_axes();
  named(*s, "ppermute", [&] {
    if (s->recv_from >= 0) {
      s->recv_buf = Tensor::empty(x.shape(), x.dtype(), x.device());
      s->recv_req = c.irecv(comm::buffer_of(s->recv_buf), s->recv_from, detail::kForwardTag);
    }
    if (s->send_to >= 0) {
      s->send_buf = x.detach();
      s->send_req = c.isend(comm::buffer_of(s->send_buf), s->send_to, detail::kForwardTag);
    }
  });
  if (tensor::needs_grad({&x})) {
    // The start node's backward keeps the state alive; the state drops its token (the
    // edge to this node) at ppermute_done, so there is no cycle once the op completes.
    std::shared_ptr<PermuteState> keep = s;
    s->token = tensor::record(
        "ppermute_start", {x}, Tensor::scalar(0.0),
        [keep](const std::vector<Tensor>&) {
          return std::vector<Tensor>{finish_backward(*keep)};
        },
        tensor::VaryingRule::AsIs);
  }
  return PermuteHandle(std::move(s));
}

Tensor ppermute_done(PermuteHandle& handle) {
  DISTJAX_CHECK(handle.valid(), InvalidArgument,
                "[ppermute_done] the handle is empty (already completed, or never started)");
  std::shared_ptr<PermuteState> s = handle.state();
  handle = PermuteHandle();
  named(*s, "ppermute", [&] {
    s->recv_req.wait();
    s->send_req.wait();
  });
  s->send_buf = Tensor();
  Tensor out = s->recv_from >= 0 ? s->recv_buf : Tensor::zeros(s->shape, s->dtype);
  s->recv_buf = Tensor();
  out.set_varying_axes(s->vma);
  if (s->token.defined() && tensor::needs_grad({&s->token})) {
    Tensor token = s->token;
    s->token = Tensor();  // the tape holds the edge now
    out = tensor::record(
        "ppermute_done", {token}, out,
        [s](const std::vector<Tensor>& g) {
          start_backward(*s, g[0]);
          return std::vector<Tensor>{Tensor::scalar(0.0)};
        },
        tensor::VaryingRule::AsIs);
  }
  return out;
}

Tensor ppermute(DeviceContext& ctx, const Tensor& x, const Axes& axes,
                const std::vector<std::pair<int, int>>& perm) {
  PermuteHandle h = ppermute_start(ctx, x, axes, perm);
  return ppermute_done(h);
}

std::vector<std::pair<int, int>> ring_permutation(int n, int shift) {
  std::vector<std::pair<int, int>> p;
  for (int i = 0; i < n; ++i)
    p.emplace_back(i, (((i + shift) % n) + n) % n);
  return p;
}

}  // namespace distjax::spmd
