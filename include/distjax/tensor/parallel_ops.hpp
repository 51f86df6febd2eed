// Tensor functions of the parallel layers: vocabulary-parallel ids and one-hot labels
// (a device holds rows [lo, lo + rows) of a table split along its rows), pmax's owner
// masks, and the gradient norm's f64 sum of squares. Not recorded on the tape.
#pragma once

#include <cstdint>

#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// Ids found outside [0, bound): how many, and the first in element order.
struct OutOfRange {
  std::int64_t count = 0;
  std::int64_t first = 0;
};

/// This device's share of an embedding lookup: for ids (i32 or i64, any shape), `local`
/// (i64, ids' shape) is id - lo and `keep` (f32, ids' shape) is 1 for an id in
/// [lo, lo + rows), else 0 and 0. With bound >= 0, ids outside [0, bound) are reported.
struct ShardIds {
  Tensor local;
  Tensor keep;
  OutOfRange out_of_range;
};
ShardIds shard_ids(const Tensor& ids, std::int64_t lo, std::int64_t rows, std::int64_t bound);

/// This device's columns of labels' one-hot rows: (labels' shape..., width) f32 with 1 at
/// label - lo for a label in [lo, lo + width), else zeros; labels (i32 or i64) outside
/// [0, bound) are reported.
struct ShardOneHot {
  Tensor one_hot;
  OutOfRange out_of_range;
};
ShardOneHot shard_one_hot(const Tensor& labels, std::int64_t lo, std::int64_t width,
                          std::int64_t bound);

/// `value` where a == b, else 0 (f32, a's shape; b has a's shape or one element).
Tensor select_equal(const Tensor& a, const Tensor& b, float value);

/// The sum of x's squares in f64 (x f32), in a fixed order: equal values give equal bits
/// on every device. A host value (the gradient norm's clipping decision).
double sum_of_squares_f64(const Tensor& x);
/// sum_of_squares_f64 of every tensor of xs (the same bits), read back together: one wait
/// per device for all of them (on a GPU, one host sync rather than one per leaf).
std::vector<double> sums_of_squares_f64(const std::vector<Tensor>& xs);

}  // namespace distjax::tensor
