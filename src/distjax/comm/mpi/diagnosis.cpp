// The diagnosis of one MPI group (see diagnosis.hpp).
#include "distjax/comm/mpi/diagnosis.hpp"

#include <sstream>
#include <utility>

#include "distjax/core/error.hpp"

namespace distjax::comm::mpi {

using namespace guards;

GroupDiagnosis::GroupDiagnosis(std::vector<int> members, int rank, int global,
                               MPI_Comm check_comm, std::chrono::milliseconds timeout,
                               bool checked)
    : members_(std::move(members)),
      label_(detail::group_label(members_)),
      rank_(rank),
      global_(global),
      check_comm_(check_comm),
      timeout_(timeout),
      checked_(checked),
      records_(flight_register(label_, members_)) {}

GroupDiagnosis::~GroupDiagnosis() { flight_retire(records_); }

void GroupDiagnosis::fail(const std::string& msg) {
  failed_ = true;
  records_->failed = true;
  failure_ = msg;
  throw CommError(msg);
}

void GroupDiagnosis::fail_wait(WaitResult w, const detail::CallDesc& d, bool all_arrived) {
  if (w == WaitResult::Aborted) fail(abort_message(d));
  if (w == WaitResult::Left) fail(left_failure());
  fail(diagnose(d, all_arrived));
}

void GroupDiagnosis::fail_mpi(const detail::CallDesc& d, const std::string& mpi_error) {
  fail(diagnose(d, false, mpi_error));
}

void GroupDiagnosis::fail_if_aborted(const detail::CallDesc& d) {
  if (poll_abort() != nullptr) fail(abort_message(d));
}

void GroupDiagnosis::disagree(const detail::CallDesc& d, int tag) {
  agree(d, tag, Clock::now() + timeout_);
  std::ostringstream os;
  os << "[" << op_kind_name(static_cast<OpKind>(d.op)) << "] devices disagree at call #" << d.seq
     << " of group " << label_ << " (descriptor hashes differ)";
  fail(os.str());
}

void GroupDiagnosis::agree(const detail::CallDesc& d, int tag, Clock::time_point deadline) {
  const int size = static_cast<int>(members_.size());
  if (size == 1) return;
  const char* name = op_kind_name(static_cast<OpKind>(d.op));
  std::vector<detail::CallDesc> all(size);
  all[rank_] = d;
  std::vector<MPI_Request> reqs;
  reqs.reserve(2 * size);
  for (int j = 0; j < size; ++j) {
    if (j == rank_) continue;
    MPI_Request r;
    check(MPI_Irecv(&all[j], sizeof(detail::CallDesc), MPI_BYTE, j, tag, check_comm_, &r), name,
          global_);
    reqs.push_back(r);
  }
  for (int j = 0; j < size; ++j) {
    if (j == rank_) continue;
    MPI_Request r;
    check(MPI_Isend(&d, sizeof(detail::CallDesc), MPI_BYTE, j, tag, check_comm_, &r), name,
          global_);
    reqs.push_back(r);
  }
  std::vector<int> done(reqs.size(), 0);
  WaitResult w = poll(reqs.data(), done.data(), reqs.size(), deadline, name, global_);
  if (w != WaitResult::Done) {
    cancel(static_cast<OpKind>(d.op), reqs.data(), done.data(), reqs.size());
    fail_wait(w, d, false);
  }
  std::string msg = detail::mismatch_message(all, members_);
  if (!msg.empty()) fail(msg);
}

// Cancels the pending point-to-point requests of a call given up on, now: their buffers
// (locals of agree) must not be written after it throws.
void GroupDiagnosis::cancel(OpKind kind, MPI_Request* reqs, const int* done,
                            std::size_t n) const {
  for (std::size_t i = 0; i < n; ++i) {
    if (done[i] || reqs[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&reqs[i]);
    // An unmatched request completes at once; a matched one finishes its transfer.
    guarded(timeout_,
            blocked_message(op_kind_name(kind), "MPI_Wait", global_, timeout_,
                            " on a cancelled transfer in group " + label_),
            [&] { return MPI_Wait(&reqs[i], MPI_STATUS_IGNORE); });
  }
}

void GroupDiagnosis::throw_transfer(WaitResult w, bool is_send, int peer, int tag) const {
  if (w == WaitResult::Left) throw CommError(left_failure());
  const char* name = is_send ? "isend" : "irecv";
  std::ostringstream os;
  if (w == WaitResult::Aborted) {
    os << "[" << name << "] transfer with device " << members_[peer] << " (tag " << tag
       << ") in group " << label_ << " abandoned: " << *poll_abort();
  } else {
    os << "[" << name << "] timed out after " << timeout_.count() << " ms: device " << global_
       << (is_send ? " sending to" : " receiving from") << " device " << members_[peer]
       << " with tag " << tag << " in group " << label_;
  }
  throw CommError(os.str());
}

std::string GroupDiagnosis::where(const detail::CallDesc& d) const {
  return " at call #" + std::to_string(d.seq) + " of group " + label_;
}

// "[op] call #k of group G abandoned: device N failed: <its message>".
std::string GroupDiagnosis::abort_message(const detail::CallDesc& d) const {
  const std::string* notice = poll_abort();
  std::ostringstream os;
  os << "[" << op_kind_name(static_cast<OpKind>(d.op)) << "] call #" << d.seq << " of group "
     << label_ << " abandoned: " << (notice ? *notice : std::string("another device failed"));
  return os.str();
}

// The message of call d that did not complete (or failed inside MPI: `mpi_error`), from
// the flight records of the group's other devices (flight_diagnose), or the abort notice
// of a device that failed first. A device that failed answers no queries (its epoch is
// closed), but every process heard of its failure before it closed: from its notice, or
// from the one it learned of the failure from. So when a peer did not answer, an abort
// notice (one that came just after this device's deadline, or during the queries) says
// what went wrong where the records cannot: under load, devices time out tens of ms
// apart, and the first to diagnose is gone when the last asks.
std::string GroupDiagnosis::diagnose(const detail::CallDesc& d, bool all_arrived,
                                     const std::string& mpi_error) {
  if (poll_abort() != nullptr) return abort_message(d);
  bool all_answered = true;
  std::string msg = flight_diagnose(*records_, global_, d,
                                    {.all_arrived = all_arrived,
                                     .checked = checked_,
                                     .timeout = timeout_,
                                     .mpi_error = mpi_error,
                                     .peer_failed = [] { return poll_abort() != nullptr; }},
                                    &all_answered);
  if (!all_answered && poll_abort() != nullptr) return abort_message(d);
  return msg;
}

}  // namespace distjax::comm::mpi
