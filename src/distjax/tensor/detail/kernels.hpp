// Host-side helpers of the op files: dtype checks, broadcast planning (the plain sizes
// the kernels of tensor/cpu/ take) and the broadcasting copy's dispatch.
#pragma once

#include <cstdint>

#include "distjax/tensor/table/broadcast.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor::detail {

/// Requires defined f32 tensors, naming the op. Devices are checked where the op
/// dispatches (Dispatch refuses mixed devices and a device without kernels).
void require_f32(const char* op, std::initializer_list<const Tensor*> ts);

/// The plan of `operand` broadcast to `out` (a valid broadcast); InvalidArgument naming
/// `op` when out's rank exceeds kMaxKernelRank.
BroadcastPlan plan_broadcast(const Shape& operand, const Shape& out, const char* op = "broadcast");
/// Flat index into `operand` for flat output index `i` (general case).
std::int64_t broadcast_index(const Shape& operand, const Shape& out, std::int64_t i);

/// out = x broadcast to out's shape (both f32, on one device), dispatched as `op`: row
/// copies, fills and strided runs rather than per-element index arithmetic.
void broadcast_copy(const char* op, const Tensor& x, Tensor& out);

}  // namespace distjax::tensor::detail
