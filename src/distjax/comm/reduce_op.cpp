// Names of the reductions (see reduce_op.hpp).
#include "distjax/comm/reduce_op.hpp"

namespace distjax::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

}  // namespace distjax::comm
