// The ragged all-to-all, blocking and in two halves. The rows travel as they are in the
// communicator's all-to-all of variable splits where the backend has one (threads, MPI);
// elsewhere (NCCL, for now) padded to `block` per device in one tiled all_to_all, the
// padding cut on arrival. Either is started non-blocking. As with ppermute_start /
// ppermute_done, the op is two tape nodes: the start node (input x, output a scalar
// token) and the done node (input the token, output the rows received). The tape runs
// nodes in reverse creation order, so the backward pass starts the exchange of the
// cotangent back at the done node and waits for it at the start node.
#include "distjax/spmd/ragged.hpp"

#include <string>

#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/detail/named.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::spmd {

using tensor::Tensor;

namespace detail {

struct RaggedState {
  comm::Communicator comm;
  DeviceContext* ctx = nullptr;
  std::string axes;  // for messages
  std::vector<std::int64_t> send_counts, recv_counts;
  std::int64_t block = 0;
  std::int64_t received = 0;  // rows this device receives (sum recv_counts)
  Shape row;  // the shape of one row
  DType dtype = DType::F32;
  Device device;
  std::uint32_t vma = 0;
  // Forward exchange (buffers owned here until done).
  Tensor send_buf, recv_buf;
  comm::Request req;
  // Backward exchange.
  Tensor grad_send, grad_recv;
  comm::Request grad_req;
  Tensor token;  // the start node's output (carries the tape edge to x)
};

}  // namespace detail

namespace {

using detail::RaggedState;

Shape rows_of(const Shape& row, std::int64_t r) {
  Shape s = row;
  s.insert(s.begin(), r);
  return s;
}

// Rows (sum counts, ...) -> (n block, ...): block j holds the counts[j] rows for device j,
// then zeros.
Tensor pad(const RaggedState& s, const Tensor& x, const std::vector<std::int64_t>& counts) {
  std::vector<Tensor> parts;
  std::int64_t at = 0;
  for (std::int64_t c : counts) {
    if (c > 0) parts.push_back(tensor::slice(x, 0, at, at + c));
    if (c < s.block) parts.push_back(Tensor::zeros(rows_of(s.row, s.block - c), s.dtype, s.device));
    at += c;
  }
  return tensor::concat(parts, 0);
}

// (n block, ...) -> (sum counts, ...): the first counts[i] rows of block i, in order.
Tensor cut(const RaggedState& s, const Tensor& got, const std::vector<std::int64_t>& counts) {
  std::vector<Tensor> kept;
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0)
      kept.push_back(tensor::slice(got, 0, std::int64_t(i) * s.block,
                                   std::int64_t(i) * s.block + counts[i]));
  return kept.empty() ? Tensor::zeros(rows_of(s.row, 0), s.dtype, s.device)
                      : tensor::concat(kept, 0);
}

// Elements of `rows` rows, per device.
std::vector<std::int64_t> elements(const RaggedState& s, const std::vector<std::int64_t>& rows) {
  const std::int64_t per_row = numel(s.row);
  std::vector<std::int64_t> e(rows.size());
  for (std::size_t j = 0; j < rows.size(); ++j) e[j] = rows[j] * per_row;
  return e;
}

// Posts the exchange of `rows` (split by `counts`, receiving `got` from each device) into
// `recv` (allocated here).
comm::Request post(RaggedState& s, const Tensor& rows, const std::vector<std::int64_t>& counts,
                   const std::vector<std::int64_t>& got, Tensor& send, Tensor& recv) {
  if (s.block == 0) return {};  // no device sends anything: every device knows it
  if (s.comm.has_all_to_allv()) {
    std::int64_t total = 0;
    for (std::int64_t g : got) total += g;
    send = rows;
    recv = Tensor::empty(rows_of(s.row, total), s.dtype, s.device);
    return s.comm.iall_to_allv(comm::buffer_of(send), elements(s, counts), comm::buffer_of(recv),
                               elements(s, got));
  }
  send = pad(s, rows, counts);
  recv = Tensor::empty(send.shape(), s.dtype, s.device);
  return s.comm.iall_to_all(comm::buffer_of(send), comm::buffer_of(recv));
}

// Waits for an exchange posted by post() and returns its rows (split by `counts`).
Tensor complete(RaggedState& s, const char* op, comm::Request& req, Tensor& send, Tensor& recv,
                const std::vector<std::int64_t>& counts) {
  detail::named(op, s.axes, [&] { req.wait(); });
  send = Tensor();
  Tensor out = s.block == 0               ? Tensor::zeros(rows_of(s.row, 0), s.dtype, s.device)
               : s.comm.has_all_to_allv() ? recv
                                          : cut(s, recv, counts);
  recv = Tensor();
  return out;
}

}  // namespace

RaggedHandle ragged_all_to_all_start(DeviceContext& ctx, const Tensor& x_in, const Axes& axes,
                                     const std::vector<std::int64_t>& send_counts,
                                     const std::vector<std::int64_t>& recv_counts,
                                     std::int64_t block) {
  tensor::check_defined(x_in, "ragged_all_to_all", "x");
  comm::Communicator c = ctx.comm(axes);
  const int n = c.size();
  DISTJAX_CHECK(x_in.rank() >= 1 && int(send_counts.size()) == n && int(recv_counts.size()) == n,
                InvalidArgument, "[ragged_all_to_all] needs x of rank >= 1 and ", n,
                " send and receive counts (the axis size), got x ", to_string(x_in.shape()), ", ",
                send_counts.size(), " and ", recv_counts.size());
  std::int64_t sent = 0;
  for (int j = 0; j < n; ++j) {
    DISTJAX_CHECK(send_counts[j] >= 0 && send_counts[j] <= block && recv_counts[j] >= 0 &&
                      recv_counts[j] <= block,
                  InvalidArgument, "[ragged_all_to_all] counts ", send_counts[j], " (to ", j,
                  ") and ", recv_counts[j], " (from ", j, ") must be in [0, block = ", block,
                  "]");
    sent += send_counts[j];
  }
  DISTJAX_CHECK(sent == x_in.size(0), InvalidArgument, "[ragged_all_to_all] the send counts add to ",
                sent, " rows, x has ", x_in.size(0));
  const Tensor x = pvary(ctx, x_in, axes);  // the transpose takes per-device cotangents
  ++ctx.counters().collective_calls["ragged_all_to_all"];
  auto s = std::make_shared<RaggedState>();
  s->comm = c;
  s->ctx = &ctx;
  s->axes = axes.str();
  s->send_counts = send_counts;
  s->recv_counts = recv_counts;
  s->block = block;
  for (std::int64_t r : recv_counts) s->received += r;
  s->row = Shape(x.shape().begin() + 1, x.shape().end());
  s->dtype = x.dtype();
  s->device = x.device();
  s->vma = x.varying_axes();
  detail::named("ragged_all_to_all", s->axes, [&] {
    s->req = post(*s, x.detach(), send_counts, recv_counts, s->send_buf, s->recv_buf);
  });
  if (tensor::needs_grad({&x})) {
    // The start node's backward keeps the state alive; the state drops its token (the edge
    // to this node) at the done half, so there is no cycle once the op completes.
    std::shared_ptr<RaggedState> keep = s;
    s->token = tensor::record(
        "ragged_all_to_all_start", {x}, Tensor::scalar(0.0),
        [keep](const std::vector<Tensor>&) {
          RaggedState& st = *keep;
          return std::vector<Tensor>{complete(st, "ragged_all_to_all transpose", st.grad_req,
                                              st.grad_send, st.grad_recv, st.send_counts)};
        },
        tensor::VaryingRule::AsIs);
  }
  return RaggedHandle(std::move(s));
}

Tensor ragged_all_to_all_done(RaggedHandle& handle) {
  DISTJAX_CHECK(handle.valid(), InvalidArgument,
                "[ragged_all_to_all_done] the handle is empty (already completed, or never "
                "started)");
  std::shared_ptr<RaggedState> s = std::move(handle.state_);
  handle = RaggedHandle();
  Tensor out = complete(*s, "ragged_all_to_all", s->req, s->send_buf, s->recv_buf, s->recv_counts);
  out.set_varying_axes(s->vma);
  if (s->token.defined() && tensor::needs_grad({&s->token})) {
    Tensor token = s->token;
    s->token = Tensor();  // the tape holds the edge now
    out = tensor::record(
        "ragged_all_to_all_done", {token}, out,
        [s](const std::vector<Tensor>& g) {
          ++s->ctx->counters().collective_calls["ragged_all_to_all.T"];
          const Tensor gy = g[0].defined()
                                ? g[0]
                                : Tensor::zeros(rows_of(s->row, s->received), s->dtype, s->device);
          detail::named("ragged_all_to_all transpose", s->axes, [&] {
            s->grad_req =
                post(*s, gy, s->recv_counts, s->send_counts, s->grad_send, s->grad_recv);
          });
          return std::vector<Tensor>{Tensor::scalar(0.0)};
        },
        tensor::VaryingRule::AsIs);
  }
  return out;
}

Tensor ragged_all_to_all(DeviceContext& ctx, const Tensor& x, const Axes& axes,
                         const std::vector<std::int64_t>& send_counts,
                         const std::vector<std::int64_t>& recv_counts, std::int64_t block) {
  RaggedHandle h = ragged_all_to_all_start(ctx, x, axes, send_counts, recv_counts, block);
  return ragged_all_to_all_done(h);
}

}  // namespace distjax::spmd
