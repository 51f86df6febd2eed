// The MPI backend's flight recorder: each process keeps the last calls it issued on each
// of its groups and what it is waiting on; a call that times out (or fails inside MPI)
// asks the group's other processes for theirs, so its message can name the op and the
// devices that differ or are missing even when no per-call check ran (the fast mode).
// The answers are sent by every process from inside its own waits (poll), as PyTorch's
// flight recorder dumps from a watchdog. How many calls it issued on each group, those
// destroyed too, is what its finished notice tells the others (notices.hpp).
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distjax/comm/detail/call_desc.hpp"

namespace distjax::comm::mpi {

/// The records of one group on this process. Only the device's thread writes them.
struct GroupRecords {
  static constexpr int kKeep = 32;
  std::string key;                       // identifies the group across its processes
  std::uint64_t id = 0;                  // hash of key: the group in notices (notices.hpp)
  std::string label;                     // "(0,1,2,3)"
  std::vector<int> members;              // world ranks, in group rank order
  std::uint64_t issued = 0;              // calls issued (= next sequence number)
  std::uint64_t completed = 0;           // calls completed, in issue order or not
  bool failed = false;                   // the group failed on this process
  std::array<detail::CallDesc, kKeep> last{};  // last[seq % kKeep]
  void issue(const detail::CallDesc& d) {
    last[d.seq % kKeep] = d;
    issued = d.seq + 1;
  }
};

/// How far this process went on one group: what its finished notice tells the others.
struct GroupCount {
  std::uint64_t id = 0;
  std::uint64_t issued = 0;
  std::uint64_t failed = 0;  // 0 or 1 (a word, so the struct travels as plain bytes)
};

/// What the device waits on: call `seq` of `group`, or (peer >= 0) a transfer with world
/// rank `peer`. `generation` changes with every flight_waiting.
struct Awaited {
  const GroupRecords* group = nullptr;  // nullptr: nothing
  std::uint64_t seq = 0;
  OpKind kind = OpKind::Barrier;  // Send / Recv for a transfer
  int peer = -1;
  int tag = 0;
  std::uint64_t generation = 0;
};

/// What a peer said about call `seq` of a group.
struct PeerRecord {
  bool answered = false;    // replied within the grace period
  bool knows_group = false;
  std::uint64_t issued = 0;  // calls it has issued on the group
  bool has_desc = false;     // it issued call seq and still has its descriptor
  detail::CallDesc desc;
  std::string where;         // "is in all_gather call #3 of group (1,3)", "is not in a ..."
};

/// Registers a group created on this process (the k-th with this label in this launch,
/// which every member creates in the same order: splits are collective); `members` are
/// its world ranks.
std::shared_ptr<GroupRecords> flight_register(const std::string& label,
                                              const std::vector<int>& members);
/// Keeps how far this process went on group g, destroyed now, for its finished notice, and
/// its records until the launch ends: a device whose program returned still answers a
/// peer's diagnosis with the calls it made (the peer may time out on a call it completed).
void flight_retire(const std::shared_ptr<GroupRecords>& g);
/// How far this process went on each group of this launch, live ones first, then the
/// retired ones from the newest, at most `max` of them.
std::vector<GroupCount> flight_counts(std::size_t max);
/// Marks what the device waits on (a.group nullptr: nothing), for the answers to peers and
/// for the verdicts on finished notices.
void flight_waiting(const Awaited& a);
/// What the device waits on now.
const Awaited& flight_awaited();
/// What the device waits on now, from any thread: "[all_reduce] call #4 of group (0,1,2,3)",
/// "[irecv] transfer from device 5 (tag 3) in group (4,5)", or "" when it waits on nothing
/// or its program finished.
std::string flight_describe_wait();
/// Marks the device's program as finished (answers say so until the launch closes).
void flight_finished();

/// Opens a launch: queries and answers travel on `comm` (a private duplicate of
/// MPI_COMM_WORLD) with tags query_tag and query_tag + 1; forgets previous groups.
void flight_open(MPI_Comm comm, int query_tag);
/// Closes the launch: withdraws the posted receive.
void flight_close();
/// Answers the queries that have arrived (never blocks). Called from every wait.
void flight_serve();
/// Asks world ranks `peers` about call `seq` of group `g` and waits until all answered or
/// `until` (serving queries meanwhile), or `peer_failed` (if given) says a device failed
/// (an abort notice, notices.hpp: a peer that failed has stopped answering). One
/// PeerRecord per peer, in order.
std::vector<PeerRecord> flight_query(const GroupRecords& g, std::uint64_t seq,
                                     const std::vector<int>& peers,
                                     std::chrono::steady_clock::time_point until,
                                     bool (*peer_failed)() = nullptr);

/// How a call ended for flight_diagnose.
struct CallEnd {
  bool all_arrived = false;  // the per-call check had completed
  bool checked = false;      // the per-call check runs on this group
  std::chrono::milliseconds timeout{0};
  std::string mpi_error;  // empty: it timed out; else MPI's error
  bool (*peer_failed)() = nullptr;  // whether a device failed: flight_query stops waiting
};
/// The message of call d of group g on world rank `device` that did not complete (timed
/// out, or failed inside MPI), built from the flight records of the group's other devices
/// (flight_query): those that called something else at this sequence number, those that
/// had not reached it (and where they are), and those that did not answer. Sets
/// *all_answered (if given) to whether every peer answered.
std::string flight_diagnose(const GroupRecords& g, int device, const detail::CallDesc& d,
                            const CallEnd& end, bool* all_answered = nullptr);

/// After the call `seq` of group g timed out on world rank `self`, with the answers `recs`
/// of the group's other devices `peers` to its flight query: asks every other process of
/// the other hosts (until `until`) and returns "no process of host distjax-host1 answers
/// (devices 4-7): the host is lost or its link is cut" for each host none of whose
/// processes answered, joined by "; " (empty when each has one that answered, when every
/// process is on this host, or when the hosts are unknown). A host lost shows so even when
/// the device timed out waiting on a live peer that waits on it.
std::string silent_hosts(const GroupRecords& g, std::uint64_t seq, int self,
                         const std::vector<int>& peers, const std::vector<PeerRecord>& recs,
                         std::chrono::steady_clock::time_point until, bool (*peer_failed)());

}  // namespace distjax::comm::mpi
