// The MPI backend's per-call exchange (private to src/distjax/comm/mpi): a recursive-
// doubling all-reduce, point-to-point on a private communicator, of a call's descriptor
// hash and, for a small all-reduce, of its data too. One round of eager messages both
// checks the call against the other devices' and carries it, so a small checked
// all-reduce costs what MPI's own small all-reduce costs (issue 8: 2.8 us against 0.7 us
// when the check was a separate MPI_Iallreduce, and MPI_Iallreduce polled with MPI_Test
// alone is ~3x a blocking MPI_Allreduce).
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <cstring>

#include "distjax/comm/communicator.hpp"

namespace distjax::comm::mpi {

namespace guards {
void check(int rc, const char* op, int device);
}

/// One exchange: every rank contributes (h, ~h) for its descriptor hash h and optionally
/// `n` elements (f32, f64, i32 or i64); every rank ends with the bitwise AND of the words over
/// the group and the sum (or max) of the elements. All ranks called the same thing iff
/// AND(h) == ~AND(~h) (both are then h). Reductions combine the lower ranks' partial with
/// the higher ranks' in that order on both partners, so every rank gets the same bits.
/// Group sizes that are not a power of two fold the extra ranks in first (each sends to
/// rank - 2^k and receives the result from it). A message of another length than this
/// rank's (a different call with the same sequence number) counts as a disagreement.
///
/// Steps advance only in progress(), which never blocks (the communicator makes a call
/// with an exchange in flight guards::Pending, so that every wait advances it). The memory MPI reads and writes
/// is the object's own: one given up on must be kept alive (guards::graveyard) or
/// finished, never destroyed with requests pending.
class Exchange {
 public:
  /// The largest payload, in bytes (after bf16/f16 were widened to f32). Open MPI's
  /// shared-memory transport copies messages of up to 256 bytes inline (16 of them the
  /// header here): up to 240 bytes of payload an exchange costs what MPI_Allreduce does,
  /// above that ~0.6-0.9x of it on 2 processes, still ahead of MPI_Iallreduce polled
  /// with MPI_Test (and of its check) up to this size.
  static constexpr int kMaxPayload = 1024;

  /// Starts the exchange of call `tag` (> 0) on `comm` (rank `rank` of `size`): posts its
  /// first step. `payload`: n elements of `dtype` (F32, F64, I32 or I64) reduced with `op`
  /// (Sum or Max); nullptr and 0 for the check alone.
  void start(MPI_Comm comm, int rank, int size, int tag, std::uint64_t hash, const void* payload,
             int n, DType dtype, ReduceOp op, const char* name, int device);
  /// A nonblocking look: completes the steps whose messages arrived and posts the next;
  /// true once the exchange is done. Throws CommError on an MPI error.
  bool progress() {
    if (rc_ != MPI_SUCCESS) guards::check(rc_, name_, device_);  // failed in try_progress
    while (step_ < nsteps_) {
      if (!test_step()) return false;
      finish_step();
      if (++step_ < nsteps_) post_step();
    }
    return true;
  }
  /// progress() for the background (guards::Pending): never throws; an MPI error is kept
  /// for the owner's progress() to throw.
  bool try_progress() noexcept {
    if (rc_ != MPI_SUCCESS) return false;
    try {
      return progress();
    } catch (...) {
      return false;
    }
  }
  /// After progress() returned true: whether every rank's hash (and length) matched.
  bool agreed() const { return mine_.w[0] == ~mine_.w[1]; }
  /// After progress() returned true: the reduced payload (n elements of the dtype).
  const void* result() const { return mine_.data; }

 private:
  struct Msg {
    std::uint64_t w[2];
    alignas(8) unsigned char data[kMaxPayload];
  };
  static constexpr int kHeader = 2 * sizeof(std::uint64_t);
  enum class Role : std::uint8_t { Exchange, FoldIn, SendResult, Extra };
  struct Step {
    int peer;
    Role role;
  };

  /// Keeps a failed MPI call's code and throws CommError with MPI's message.
  void check(int rc) {
    if (rc == MPI_SUCCESS) return;
    rc_ = rc;
    guards::check(rc, name_, device_);
  }
  bool test_step();
  void finish_step();
  void post_step();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, tag_ = 0, bytes_ = kHeader, n_ = 0;
  DType dtype_ = DType::F32;
  ReduceOp op_ = ReduceOp::Sum;
  const char* name_ = "";
  int device_ = 0;
  int step_ = 0, nsteps_ = 0;
  int rc_ = MPI_SUCCESS;  // the first MPI error
  Step steps_[34];  // fold-in, up to 32 doubling steps, send-result
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // receive, send
  MPI_Status status_;
  Msg mine_, theirs_;
};

}  // namespace distjax::comm::mpi
