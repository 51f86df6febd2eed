// The MPI backend's diagnosis of one group (private to src/distjax/comm/mpi): whether the
// group has failed, and the CommError messages that say why a call or transfer did not
// complete, naming the op, the call and the devices that differ or are missing (from the
// flight records, the notices, or an exchange of every device's call descriptor). The
// transport (mpi_communicator.cpp) moves the data and hands each wait that went wrong here.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/comm/mpi/guards.hpp"

namespace distjax::comm::mpi {

/// Marks what the device waits on while it lives: call d of group g, or a transfer with
/// world rank `peer`; for peers' flight-record queries and the verdicts on finished notices.
struct Waiting {
  Waiting(const GroupRecords* g, const detail::CallDesc& d) {
    flight_waiting({.group = g, .seq = d.seq, .kind = static_cast<OpKind>(d.op)});
  }
  Waiting(const GroupRecords* g, OpKind kind, int peer, int tag) {
    flight_waiting({.group = g, .kind = kind, .peer = peer, .tag = tag});
  }
  ~Waiting() { flight_waiting({}); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
};

/// One group's failure state and error messages on this process. Registers the group's
/// flight records (retired with this object). Once fail() ran, every later call of the
/// group throws the same message (throw_if_failed).
class GroupDiagnosis {
 public:
  /// The group of world ranks `members` (this process is rank `rank`, world rank
  /// `global`); `check_comm` (borrowed) carries agree()'s descriptors; `checked`: the
  /// per-call check runs on the group.
  GroupDiagnosis(std::vector<int> members, int rank, int global, MPI_Comm check_comm,
                 std::chrono::milliseconds timeout, bool checked);
  ~GroupDiagnosis();
  GroupDiagnosis(const GroupDiagnosis&) = delete;
  GroupDiagnosis& operator=(const GroupDiagnosis&) = delete;

  /// "(0,1,2,3)".
  const std::string& label() const { return label_; }
  /// World ranks, in group rank order.
  const std::vector<int>& members() const { return members_; }
  GroupRecords& records() { return *records_; }
  bool failed() const { return failed_; }
  /// Throws the group's failure, if it failed.
  void throw_if_failed() const {
    if (failed_) throw CommError(failure_);
  }

  /// Fails the group with msg and throws it.
  [[noreturn]] void fail(const std::string& msg);
  /// Fails the group after a wait on call d ended with w (not Done): on an abort notice,
  /// on a device that left the call (its finished notice), or at the timeout, diagnosed
  /// from the flight records (`all_arrived`: the check had completed).
  [[noreturn]] void fail_wait(guards::WaitResult w, const detail::CallDesc& d, bool all_arrived);
  /// Fails the group after call d failed inside MPI with `mpi_error`.
  [[noreturn]] void fail_mpi(const detail::CallDesc& d, const std::string& mpi_error);
  /// Fails the group when an abort notice has arrived (a device failed): call d is not
  /// started.
  void fail_if_aborted(const detail::CallDesc& d);
  /// The exchange of call d said the devices disagree (every device sees the same):
  /// exchanges the descriptors (agree) to name what each called, and fails the group.
  [[noreturn]] void disagree(const detail::CallDesc& d, int tag);
  /// Exchanges call d's descriptor with every other rank, point-to-point on the check
  /// communicator with `tag` (call d's own), and fails the group on a mismatch or when a
  /// rank does not arrive by `deadline`.
  void agree(const detail::CallDesc& d, int tag, guards::Clock::time_point deadline);
  /// Throws (without failing the group) why a point-to-point wait with group rank `peer`
  /// ended with w (not Done).
  [[noreturn]] void throw_transfer(guards::WaitResult w, bool is_send, int peer, int tag) const;

  /// " at call #k of group G".
  std::string where(const detail::CallDesc& d) const;

 private:
  std::string abort_message(const detail::CallDesc& d) const;
  std::string diagnose(const detail::CallDesc& d, bool all_arrived,
                       const std::string& mpi_error = "");
  void cancel(OpKind kind, MPI_Request* reqs, const int* done, std::size_t n) const;

  std::vector<int> members_;
  std::string label_;
  int rank_ = 0, global_ = 0;
  MPI_Comm check_comm_;
  std::chrono::milliseconds timeout_;
  bool checked_ = false;
  std::shared_ptr<GroupRecords> records_;
  bool failed_ = false;
  std::string failure_;
};

}  // namespace distjax::comm::mpi
