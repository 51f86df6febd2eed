// Kernel family: what a communication backend does to a device's memory: zero fills and
// rank-order reductions of raw blocks (the blocks of several simulated devices of one
// kind, all reachable from the calling thread), waits for the calling thread's queued work,
// events that order one thread's work before another thread reads it, and page-locked host
// blocks for staging. Copies are the copy family's (copy_2d, to_host, from_host).
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

/// The reductions of a collective: Mean is the sum divided by a divisor.
enum class RankReduce : std::uint8_t { Sum, Mean, Max };

struct MemoryKernels {
  /// nbytes of dst set to zero bytes.
  void (*zero)(void* dst, std::size_t nbytes);
  /// dsts[j][i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i] for i < n and every one
  /// of the m destinations, folded left in source order (bf16 and f16 in f32, rounded
  /// once), Mean dividing the sum by `divisor`: the same bits on every device kind. max
  /// keeps the first operand unless the next is greater (a NaN in the first source stays).
  /// A destination may alias a source at the same offset. `dsts` and `srcs` are host memory
  /// holding m and k device pointers, 1 <= m, k <= kMaxRankSources. (Several destinations:
  /// one pass of an all-reduce's share over every rank's copy.)
  void (*reduce_ranks)(void* const* dsts, int m, const void* const* srcs, int k, std::int64_t n,
                       DType dtype, RankReduce op, int divisor);
  /// Returns when the calling thread's queued work is done (a no-op on the CPU).
  void (*synchronize)();
  /// An event marking the calling thread's work queued so far (null where kernels run at
  /// once); event_wait returns once that work is done and releases the event;
  /// event_stream_wait makes the calling thread's stream wait for it on the device (the host goes
  /// on; the event stays); event_done tells, without waiting, whether the work is done;
  /// event_release releases it without waiting. A device whose event_record never makes an event
  /// (its kernels run at once: the CPU) leaves the other four null: nothing can call them.
  void* (*event_record)();
  void (*event_wait)(void* event);
  bool (*event_done)(void* event);
  void (*event_stream_wait)(void* event);
  void (*event_release)(void* event);
  /// nbytes from device memory into host_dst, a block of host_alloc's, queued like a
  /// kernel (done when an event recorded after it is; at once on the CPU).
  void (*to_host_async)(const void* src, void* host_dst, std::size_t nbytes);
  /// Host memory of at least nbytes the device copies to and from at full speed
  /// (page-locked on a GPU), and its release.
  void* (*host_alloc)(std::size_t nbytes);
  void (*host_free)(void* p, std::size_t nbytes);
};

/// The most sources one reduce_ranks call folds, and destinations it writes (the simulated
/// devices of one group).
inline constexpr int kMaxRankSources = 64;

}  // namespace distjax::tensor::detail
