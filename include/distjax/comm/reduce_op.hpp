// ReduceOp: the reduction of an all_reduce or a reduce_scatter.
#pragma once

#include <cstdint>

namespace distjax::comm {

/// Reduction of all_reduce / reduce_scatter. Mean is the sum divided by the group size.
enum class ReduceOp : std::uint8_t { Sum, Mean, Max };
/// "sum", "mean", "max".
const char* reduce_op_name(ReduceOp op);

}  // namespace distjax::comm
