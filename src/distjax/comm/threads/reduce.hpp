// The threads backend's reduction kernel: detail::reduce_into's contract and results
// (bit for bit), with an AVX-512 path for f32 that streams large destinations to memory.
#pragma once

#include <cstdint>

#include "distjax/comm/communicator.hpp"

namespace distjax::comm::threads {

/// Destinations of at least this many bytes are written with non-temporal stores: they
/// exceed what the caches could keep for the reader anyway, and streaming them skips
/// the read-for-ownership of every destination line (a third of the reduction's traffic).
constexpr std::int64_t kStreamBytes = std::int64_t(8) << 20;

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i], folded in rank order (so
/// results are bit-reproducible and identical to detail::reduce_into); Mean divides the
/// sum by `divisor`. dst may alias any source at the same offsets.
void reduce_rank_order(void* dst, const void* const* srcs, int k, std::int64_t n, DType dtype,
                       ReduceOp op, int divisor);

}  // namespace distjax::comm::threads
