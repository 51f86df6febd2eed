// The per-call exchange of the MPI backend (see exchange.hpp).
#include "distjax/comm/mpi/exchange.hpp"

#include "distjax/core/dtype.hpp"

namespace distjax::comm::mpi {

namespace {

// dst[i] = a[i] (+ or max) b[i]; dst may alias a or b.
template <class T>
void combine(void* dst, const void* a, const void* b, int n, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (op == ReduceOp::Max) {
    for (int i = 0; i < n; ++i) d[i] = x[i] < y[i] ? y[i] : x[i];
  } else {
    for (int i = 0; i < n; ++i) d[i] = x[i] + y[i];
  }
}

}  // namespace

void Exchange::start(MPI_Comm comm, int rank, int size, int tag, std::uint64_t hash,
                     const void* payload, int n, DType dtype, ReduceOp op, const char* name,
                     int device) {
  comm_ = comm;
  rank_ = rank;
  tag_ = tag;
  n_ = n;
  dtype_ = dtype;
  op_ = op;
  name_ = name;
  device_ = device;
  const int payload_bytes = n * static_cast<int>(dtype_size(dtype));
  bytes_ = kHeader + payload_bytes;
  mine_.w[0] = hash;
  mine_.w[1] = ~hash;
  if (payload_bytes > 0) std::memcpy(mine_.data, payload, payload_bytes);
  step_ = nsteps_ = 0;
  rc_ = MPI_SUCCESS;
  int pof2 = 1;
  while (pof2 <= size / 2) pof2 *= 2;
  const int rem = size - pof2;
  if (rank >= pof2) {
    steps_[nsteps_++] = {rank - pof2, Role::Extra};
  } else {
    if (rank < rem) steps_[nsteps_++] = {rank + pof2, Role::FoldIn};
    for (int mask = 1; mask < pof2; mask <<= 1) steps_[nsteps_++] = {rank ^ mask, Role::Exchange};
    if (rank < rem) steps_[nsteps_++] = {rank + pof2, Role::SendResult};
  }
  if (nsteps_ > 0) post_step();
}

void Exchange::post_step() {
  const Step& s = steps_[step_];
  if (s.role != Role::SendResult)
    check(MPI_Irecv(&theirs_, sizeof(Msg), MPI_BYTE, s.peer, tag_, comm_, &req_[0]));
  if (s.role != Role::FoldIn)
    check(MPI_Isend(&mine_, bytes_, MPI_BYTE, s.peer, tag_, comm_, &req_[1]));
}

bool Exchange::test_step() {
  int flag = 1;
  if (req_[0] != MPI_REQUEST_NULL) {
    check(MPI_Test(&req_[0], &flag, &status_));
    if (!flag) return false;
  }
  if (req_[1] != MPI_REQUEST_NULL) {
    check(MPI_Test(&req_[1], &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
  }
  return true;
}

void Exchange::finish_step() {
  const Step& s = steps_[step_];
  if (s.role == Role::SendResult) return;
  int got = 0;
  MPI_Get_count(&status_, MPI_BYTE, &got);
  if (s.role == Role::Extra) {
    std::memcpy(&mine_, &theirs_, static_cast<std::size_t>(bytes_));
  } else {
    mine_.w[0] &= theirs_.w[0];
    mine_.w[1] &= theirs_.w[1];
    // The lower ranks' partial first, on both partners.
    const bool lower = rank_ < s.peer;
    const void* a = lower ? mine_.data : theirs_.data;
    const void* b = lower ? theirs_.data : mine_.data;
    switch (dtype_) {
      case DType::I32: combine<std::int32_t>(mine_.data, a, b, n_, op_); break;
      case DType::I64: combine<std::int64_t>(mine_.data, a, b, n_, op_); break;
      case DType::F64: combine<double>(mine_.data, a, b, n_, op_); break;
      case DType::F32: combine<float>(mine_.data, a, b, n_, op_); break;
      case DType::BF16:  // widened to f32 by the caller
      case DType::F16: break;
    }
  }
  // Another call's message (its length differs): a disagreement everyone will see.
  if (got != bytes_) mine_.w[0] = mine_.w[1] = 0;
}

}  // namespace distjax::comm::mpi
