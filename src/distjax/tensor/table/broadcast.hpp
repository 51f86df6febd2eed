// Plain descriptors of how a kernel walks an operand: a broadcast operand against its
// output, and a permutation. Sizes and strides only (no Shape, no Tensor), so kernels of
// several families take them by value.
#pragma once

#include <cstdint>

namespace distjax::tensor::detail {

/// The largest rank a kernel descriptor holds (the op refuses a larger one).
constexpr int kMaxKernelRank = 16;

/// Layout of a broadcast operand against an output shape: the output viewed as
/// (outer, inner) where the operand is either full, a row (inner), a column (outer),
/// a scalar, or needs general indexing. `dims` and `strides` describe every kind
/// (general indexing reads them).
struct BroadcastPlan {
  enum class Kind { Same, Scalar, Row, Col, General };
  Kind kind = Kind::General;
  std::int64_t outer = 1, inner = 1;
  int rank = 0;                               // the output's rank
  std::int64_t dims[kMaxKernelRank] = {};     // the output's dimensions
  std::int64_t strides[kMaxKernelRank] = {};  // the operand's stride per output dimension,
                                              // 0 where it broadcasts
};

/// Flat index into the operand for flat output index `i`.
inline std::int64_t broadcast_index(const BroadcastPlan& q, std::int64_t i) {
  std::int64_t idx = 0;
  for (int d = q.rank - 1; d >= 0; --d) {
    idx += (i % q.dims[d]) * q.strides[d];
    i /= q.dims[d];
  }
  return idx;
}

/// A permutation of a contiguous input: the output's dimensions and, per output
/// dimension, the input's stride in elements.
struct PermutePlan {
  int rank = 0;
  std::int64_t dims[kMaxKernelRank] = {};
  std::int64_t strides[kMaxKernelRank] = {};
};

}  // namespace distjax::tensor::detail
