// Argument checks of the communicator front (communicator.cpp), shared by its calls.
#pragma once

#include <utility>
#include <vector>

#include "distjax/comm/buffer.hpp"
#include "distjax/comm/reduce_op.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm::detail {

/// Throws InvalidArgument naming `op` unless every pair is in range and no rank is twice a
/// source or twice a destination.
void check_pairs(const char* op, const std::vector<std::pair<int, int>>& pairs, int size);
/// Throws InvalidArgument for a negative count or a null buffer with count > 0 (the
/// device is each backend's to check: HostBuffers for those that move memory on the host).
void check_buffer(const char* op, const Buffer& b);
/// Argument check of all_reduce / reduce_scatter: throws NotImplemented unless dtype is
/// one reduce_into handles (f32, bf16, f16, i32, i64, f64; a value outside DType would
/// otherwise reduce nothing), and InvalidArgument unless reduce is Sum, Mean or Max.
void check_reducible(const char* op, DType dtype, ReduceOp reduce);

}  // namespace distjax::comm::detail
