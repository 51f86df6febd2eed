// The communicator front: checks every call's arguments once, then hands the backend
// buffers described as comm::Buffer; a blocking call is the backend's non-blocking entry
// told that the caller waits at once (Completion::Now), and waited on.
#include "distjax/comm/communicator.hpp"

#include "distjax/comm/detail/checks.hpp"
#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm {

CommunicatorImpl::CommunicatorImpl(int rank, std::vector<int> members,
                                   std::shared_ptr<CommStats> stats)
    : rank_(rank), members_(std::move(members)), stats_(std::move(stats)) {}

void CommunicatorImpl::set_link_model(const LinkModel&) {
  DISTJAX_THROW(NotImplemented,
                "[set_link_model] this backend communicates over a real interconnect; only the "
                "threads backend simulates a link model");
}

Request CommunicatorImpl::iall_to_allv(const Buffer&, const std::vector<std::int64_t>&,
                                       const Buffer&, const std::vector<std::int64_t>&,
                                       Completion) {
  DISTJAX_THROW(NotImplemented,
                "[all_to_allv] this backend has no all-to-all of variable splits yet (ask "
                "Communicator::has_all_to_allv(); pad the blocks to one size and use all_to_all)");
}

namespace {

using detail::check_buffer;
using detail::check_reducible;

void check_same_dtype(const char* op, const Buffer& send, const Buffer& recv) {
  DISTJAX_CHECK(send.dtype == recv.dtype, InvalidArgument, "[", op, "] send is ",
                dtype_name(send.dtype), " but recv is ", dtype_name(recv.dtype));
}

// The two buffers of a reduction or gather: valid, same dtype, recv.count = send.count x
// recv_per_send / send_per_recv.
void check_pair(const char* op, const Buffer& send, const Buffer& recv, std::int64_t send_blocks,
                std::int64_t recv_blocks) {
  check_buffer(op, send);
  check_buffer(op, recv);
  check_same_dtype(op, send, recv);
  DISTJAX_CHECK(send.count * recv_blocks == recv.count * send_blocks, InvalidArgument, "[", op,
                "] send holds ", send.count, " elements and recv ", recv.count, "; expected ",
                send_blocks, ":", recv_blocks, " blocks");
}

}  // namespace

// ---------------------------------------------------------------- Buffer forms

void Communicator::all_reduce(const Buffer& send, const Buffer& recv, ReduceOp op) {
  check_pair("all_reduce", send, recv, 1, 1);
  check_reducible("all_reduce", send.dtype, op);
  impl_->iall_reduce(send, recv, op, Completion::Now).wait();
}
Request Communicator::iall_reduce(const Buffer& send, const Buffer& recv, ReduceOp op) {
  check_pair("iall_reduce", send, recv, 1, 1);
  check_reducible("iall_reduce", send.dtype, op);
  return impl_->iall_reduce(send, recv, op, Completion::Later);
}
void Communicator::all_gather(const Buffer& send, const Buffer& recv) {
  check_pair("all_gather", send, recv, 1, size());
  impl_->iall_gather(send, recv, Completion::Now).wait();
}
Request Communicator::iall_gather(const Buffer& send, const Buffer& recv) {
  check_pair("iall_gather", send, recv, 1, size());
  return impl_->iall_gather(send, recv, Completion::Later);
}
void Communicator::reduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op) {
  check_pair("reduce_scatter", send, recv, size(), 1);
  check_reducible("reduce_scatter", send.dtype, op);
  impl_->ireduce_scatter(send, recv, op, Completion::Now).wait();
}
Request Communicator::ireduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op) {
  check_pair("ireduce_scatter", send, recv, size(), 1);
  check_reducible("ireduce_scatter", send.dtype, op);
  return impl_->ireduce_scatter(send, recv, op, Completion::Later);
}

// ---------------------------------------------------------------- raw-pointer forms

void Communicator::all_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                              ReduceOp op) {
  all_reduce(Buffer::host(send, count, dtype), Buffer::host(recv, count, dtype), op);
}
Request Communicator::iall_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                                  ReduceOp op) {
  return iall_reduce(Buffer::host(send, count, dtype), Buffer::host(recv, count, dtype), op);
}
void Communicator::all_gather(const void* send, void* recv, std::int64_t count, DType dtype) {
  check_buffer("all_gather", Buffer::host(send, count, dtype));  // before count * size()
  all_gather(Buffer::host(send, count, dtype), Buffer::host(recv, count * size(), dtype));
}
Request Communicator::iall_gather(const void* send, void* recv, std::int64_t count,
                                  DType dtype) {
  check_buffer("iall_gather", Buffer::host(send, count, dtype));
  return iall_gather(Buffer::host(send, count, dtype), Buffer::host(recv, count * size(), dtype));
}
void Communicator::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                                  ReduceOp op) {
  check_buffer("reduce_scatter", Buffer::host(recv, count, dtype));
  reduce_scatter(Buffer::host(send, count * size(), dtype), Buffer::host(recv, count, dtype), op);
}
Request Communicator::ireduce_scatter(const void* send, void* recv, std::int64_t count,
                                      DType dtype, ReduceOp op) {
  check_buffer("ireduce_scatter", Buffer::host(recv, count, dtype));
  return ireduce_scatter(Buffer::host(send, count * size(), dtype),
                         Buffer::host(recv, count, dtype), op);
}

namespace {

void check_all_to_all(const char* op, const Buffer& send, const Buffer& recv, int size) {
  check_pair(op, send, recv, 1, 1);
  DISTJAX_CHECK(send.count % size == 0, InvalidArgument, "[", op, "] send holds ", send.count,
                " elements, not ", size, " equal blocks");
  DISTJAX_CHECK(send.data != recv.data || send.count == 0, InvalidArgument, "[", op,
                "] send and recv must be different buffers");
}

// One count per rank, none negative, adding up to the buffer's length.
void check_counts(const char* op, const char* which, const Buffer& b,
                  const std::vector<std::int64_t>& counts, int size) {
  DISTJAX_CHECK(static_cast<int>(counts.size()) == size, InvalidArgument, "[", op, "] ", which,
                "_counts has ", counts.size(), " entries for a group of ", size);
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    DISTJAX_CHECK(counts[j] >= 0, InvalidArgument, "[", op, "] ", which, "_counts[", j,
                  "] is ", counts[j], ", must be >= 0");
    sum += counts[j];
  }
  DISTJAX_CHECK(sum == b.count, InvalidArgument, "[", op, "] ", which, "_counts add up to ", sum,
                " elements but ", which, " holds ", b.count);
}

void check_all_to_allv(const char* op, const Buffer& send,
                       const std::vector<std::int64_t>& send_counts, const Buffer& recv,
                       const std::vector<std::int64_t>& recv_counts, int size) {
  check_buffer(op, send);
  check_buffer(op, recv);
  check_same_dtype(op, send, recv);
  check_counts(op, "send", send, send_counts, size);
  check_counts(op, "recv", recv, recv_counts, size);
  DISTJAX_CHECK(send.data != recv.data || send.count == 0 || recv.count == 0, InvalidArgument,
                "[", op, "] send and recv must be different buffers");
}

void check_broadcast(const char* op, const Buffer& buf, int root, int size) {
  check_buffer(op, buf);
  DISTJAX_CHECK(root >= 0 && root < size, InvalidArgument, "[", op, "] root ", root,
                " is out of range for a group of ", size);
}

void check_permute(const char* op, const Buffer& send, const Buffer& recv,
                   const std::vector<std::pair<int, int>>& pairs, int size) {
  check_pair(op, send, recv, 1, 1);
  DISTJAX_CHECK(send.data != recv.data || send.count == 0, InvalidArgument, "[", op,
                "] send and recv must be different buffers");
  detail::check_pairs(op, pairs, size);
}

}  // namespace

void Communicator::all_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                               const Buffer& recv, const std::vector<std::int64_t>& recv_counts) {
  check_all_to_allv("all_to_allv", send, send_counts, recv, recv_counts, size());
  impl_->iall_to_allv(send, send_counts, recv, recv_counts, Completion::Now).wait();
}
Request Communicator::iall_to_allv(const Buffer& send, const std::vector<std::int64_t>& send_counts,
                                   const Buffer& recv,
                                   const std::vector<std::int64_t>& recv_counts) {
  check_all_to_allv("iall_to_allv", send, send_counts, recv, recv_counts, size());
  return impl_->iall_to_allv(send, send_counts, recv, recv_counts, Completion::Later);
}

void Communicator::all_to_all(const void* send, void* recv, std::int64_t count, DType dtype) {
  check_buffer("all_to_all", Buffer::host(send, count, dtype));  // before count * size()
  all_to_all(Buffer::host(send, count * size(), dtype), Buffer::host(recv, count * size(), dtype));
}
void Communicator::all_to_all(const Buffer& send, const Buffer& recv) {
  check_all_to_all("all_to_all", send, recv, size());
  impl_->iall_to_all(send, recv, Completion::Now).wait();
}
Request Communicator::iall_to_all(const void* send, void* recv, std::int64_t count,
                                  DType dtype) {
  check_buffer("iall_to_all", Buffer::host(send, count, dtype));  // before count * size()
  return iall_to_all(Buffer::host(send, count * size(), dtype),
                     Buffer::host(recv, count * size(), dtype));
}
Request Communicator::iall_to_all(const Buffer& send, const Buffer& recv) {
  check_all_to_all("iall_to_all", send, recv, size());
  return impl_->iall_to_all(send, recv, Completion::Later);
}

void Communicator::broadcast(void* buf, std::int64_t count, DType dtype, int root) {
  broadcast(Buffer::host(buf, count, dtype), root);
}
void Communicator::broadcast(const Buffer& buf, int root) {
  check_broadcast("broadcast", buf, root, size());
  impl_->ibroadcast(buf, root, Completion::Now).wait();
}
Request Communicator::ibroadcast(void* buf, std::int64_t count, DType dtype, int root) {
  return ibroadcast(Buffer::host(buf, count, dtype), root);
}
Request Communicator::ibroadcast(const Buffer& buf, int root) {
  check_broadcast("ibroadcast", buf, root, size());
  return impl_->ibroadcast(buf, root, Completion::Later);
}

void Communicator::permute(const void* send, void* recv, std::int64_t count, DType dtype,
                           const std::vector<std::pair<int, int>>& pairs) {
  permute(Buffer::host(send, count, dtype), Buffer::host(recv, count, dtype), pairs);
}
void Communicator::permute(const Buffer& send, const Buffer& recv,
                           const std::vector<std::pair<int, int>>& pairs) {
  check_permute("permute", send, recv, pairs, size());
  impl_->ipermute(send, recv, pairs, Completion::Now).wait();
}
Request Communicator::ipermute(const void* send, void* recv, std::int64_t count, DType dtype,
                               const std::vector<std::pair<int, int>>& pairs) {
  return ipermute(Buffer::host(send, count, dtype), Buffer::host(recv, count, dtype), pairs);
}
Request Communicator::ipermute(const Buffer& send, const Buffer& recv,
                               const std::vector<std::pair<int, int>>& pairs) {
  check_permute("ipermute", send, recv, pairs, size());
  return impl_->ipermute(send, recv, pairs, Completion::Later);
}

namespace {
void check_peer(const char* op, const Buffer& b, int peer, int tag, const Communicator& c) {
  check_buffer(op, b);
  DISTJAX_CHECK(peer >= 0 && peer < c.size(), InvalidArgument, "[", op, "] peer rank ", peer,
                " is out of range for group ", detail::group_label(c.group()));
  DISTJAX_CHECK(tag >= 0 && tag < kMaxTag, InvalidArgument, "[", op, "] tag ", tag,
                " is outside [0, ", kMaxTag, ")");
}
}  // namespace

Request Communicator::isend(const void* buf, std::int64_t count, DType dtype, int dst, int tag) {
  return isend(Buffer::host(buf, count, dtype), dst, tag);
}
Request Communicator::isend(const Buffer& buf, int dst, int tag) {
  check_peer("isend", buf, dst, tag, *this);
  return impl_->isend(buf, dst, tag);
}
Request Communicator::irecv(void* buf, std::int64_t count, DType dtype, int src, int tag) {
  return irecv(Buffer::host(buf, count, dtype), src, tag);
}
Request Communicator::irecv(const Buffer& buf, int src, int tag) {
  check_peer("irecv", buf, src, tag, *this);
  return impl_->irecv(buf, src, tag);
}

}  // namespace distjax::comm
