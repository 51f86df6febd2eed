// Argument checks of the communicator front (see checks.hpp).
#include "distjax/comm/detail/checks.hpp"

#include <set>

#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

void check_pairs(const char* op, const std::vector<std::pair<int, int>>& pairs, int size) {
  std::set<int> srcs, dsts;
  for (auto [s, d] : pairs) {
    DISTJAX_CHECK(s >= 0 && s < size && d >= 0 && d < size, InvalidArgument,
                  "[", op, "] pair (", s, ", ", d, ") is out of range for a group of ", size);
    DISTJAX_CHECK(srcs.insert(s).second, InvalidArgument, "[", op, "] rank ", s,
                  " is the source of more than one pair");
    DISTJAX_CHECK(dsts.insert(d).second, InvalidArgument, "[", op, "] rank ", d,
                  " is the destination of more than one pair");
  }
}

void check_buffer(const char* op, const Buffer& b) {
  DISTJAX_CHECK(b.count >= 0, InvalidArgument, "[", op, "] count must be >= 0, got ", b.count);
  DISTJAX_CHECK(b.data != nullptr || b.count == 0, InvalidArgument, "[", op,
                "] null buffer for count ", b.count);
}

void check_reducible(const char* op, DType dtype, ReduceOp reduce) {
  bool dtype_ok = false;
  switch (dtype) {  // no default: a new DType warns here until reduce_into handles it
    case DType::F32:
    case DType::BF16:
    case DType::F16:
    case DType::I32:
    case DType::I64:
    case DType::F64:
      dtype_ok = true;
      break;
  }
  DISTJAX_CHECK(dtype_ok, NotImplemented, "[", op,
                "] expected a reducible dtype (f32, bf16, f16, i32, i64, f64), got dtype value ",
                static_cast<int>(dtype));
  bool reduce_ok = false;
  switch (reduce) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
    case ReduceOp::Max:
      reduce_ok = true;
      break;
  }
  DISTJAX_CHECK(reduce_ok, InvalidArgument, "[", op,
                "] expected a reduce op (sum, mean, max), got value ", static_cast<int>(reduce));
}

}  // namespace distjax::comm::detail
