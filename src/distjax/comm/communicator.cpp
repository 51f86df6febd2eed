// Communicator is a header-only handle; this file holds its enum names.
#include "distjax/comm/communicator.hpp"

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
