// Call descriptors of the flight recorder (what one device called at one sequence number
// of one group), and the messages built from them when devices disagree.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/reduce_op.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm::detail {

/// What one device called at one sequence number of one group. Plain data (exchanged
/// as bytes between MPI processes).
struct CallDesc {
  std::uint64_t seq = 0;
  std::int64_t count = 0;
  std::uint64_t pairs_hash = 0;  // permute: hash of the (src, dst) pairs
  std::int32_t root = 0;         // broadcast
  std::uint8_t op = 0;           // OpKind
  std::uint8_t dtype = 0;        // DType
  std::uint8_t reduce = 0;       // ReduceOp
  std::uint8_t device = 0;        // threads backend: the DeviceKind of the call's buffers
  bool operator==(const CallDesc& o) const;
};

/// The count of an all_to_allv's descriptor (an all_to_all whose blocks differ by rank):
/// described as "all_to_allv(f32)".
inline constexpr std::int64_t kVariableCount = -1;

CallDesc make_desc(std::uint64_t seq, OpKind op, std::int64_t count = 0, DType dtype = DType::F32,
                   ReduceOp reduce = ReduceOp::Sum, int root = 0, std::uint64_t pairs_hash = 0);
/// "all_reduce(count=16, f32, sum)".
std::string describe(const CallDesc& d);
/// "(0,1,2,3)" from global device ids.
std::string group_label(const std::vector<int>& members);
/// "0,2,3".
std::string join_ints(const std::vector<int>& v);
/// Runs of consecutive numbers shortened: "4-7", "0-2,5" (v ascending).
std::string join_ranges(const std::vector<int>& v);
/// "device 3", "devices 4-7" (join_ranges).
std::string devices_in_ranges(const std::vector<int>& v);
/// Empty when every descriptor equals the first; otherwise the mismatch message
/// "[a/b] devices disagree at call #k of group G: devices .. called ..; device .. called ..".
std::string mismatch_message(const std::vector<CallDesc>& descs, const std::vector<int>& members);

/// Order-insensitive hash of a permutation's (src, dst) pairs (CallDesc::pairs_hash).
std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs);
/// 64-bit hash of a descriptor (every field, the sequence number too): what the MPI
/// backend's per-call check compares instead of the descriptors themselves.
std::uint64_t hash_desc(const CallDesc& d);

}  // namespace distjax::comm::detail
