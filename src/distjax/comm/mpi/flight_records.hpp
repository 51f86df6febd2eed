// The MPI backend's flight recorder: each process keeps the last calls it issued on each
// of its groups and what it is waiting on; a call that times out (or fails inside MPI)
// asks the group's other processes for theirs, so its message can name the op and the
// devices that differ or are missing even when no per-call check ran (the fast mode).
// The answers are sent by every process from inside its own waits (poll), as PyTorch's
// flight recorder dumps from a watchdog.
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

#include "distjax/comm/detail/call.hpp"

namespace distjax::comm::mpi {

/// The records of one group on this process. Only the device's thread writes them.
struct GroupRecords {
  static constexpr int kKeep = 32;
  std::string key;                       // identifies the group across its processes
  std::string label;                     // "(0,1,2,3)"
  std::uint64_t issued = 0;              // calls issued (= next sequence number)
  std::uint64_t completed = 0;           // calls completed, in issue order or not
  std::array<detail::CallDesc, kKeep> last{};  // last[seq % kKeep]
  void issue(const detail::CallDesc& d) {
    last[d.seq % kKeep] = d;
    issued = d.seq + 1;
  }
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
/// which every member creates in the same order: splits are collective).
std::shared_ptr<GroupRecords> flight_register(const std::string& label);
/// Marks what the device waits on (nullptr: nothing), for the answers to peers.
void flight_waiting(const GroupRecords* g, std::uint64_t seq, OpKind kind);

/// Opens a launch: queries and answers travel on `comm` (a private duplicate of
/// MPI_COMM_WORLD) with tags query_tag and query_tag + 1; forgets previous groups.
void flight_open(MPI_Comm comm, int query_tag);
/// Closes the launch: withdraws the posted receive.
void flight_close();
/// Answers the queries that have arrived (never blocks). Called from every wait.
void flight_serve();
/// Asks world ranks `peers` about call `seq` of group `g` and waits until all answered or
/// `until` (serving queries meanwhile). One PeerRecord per peer, in order.
std::vector<PeerRecord> flight_query(const GroupRecords& g, std::uint64_t seq,
                                     const std::vector<int>& peers,
                                     std::chrono::steady_clock::time_point until);

}  // namespace distjax::comm::mpi
