// ArrayDataset: a data set held in memory as two arrays whose first dimension indexes
// the examples (images and labels, token windows and targets).
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/train/batch.hpp"

namespace distjax::data {

using tensor::Tensor;

/// N examples: inputs (N, ...) and labels (N, ...), any dtypes.
struct ArrayDataset {
  Tensor inputs;
  Tensor labels;

  /// N; throws InvalidArgument if inputs and labels disagree.
  std::int64_t size() const;
  /// Examples [begin, end) as a batch sharing storage.
  train::Batch slice(std::int64_t begin, std::int64_t end) const;
  /// A batch of copies of the examples at `indices`, in that order.
  train::Batch gather(const std::vector<std::int64_t>& indices) const;
  /// The whole set cut into consecutive batches of `batch_size` (the last may be
  /// smaller), sharing storage: for evaluation.
  std::vector<train::Batch> batches(std::int64_t batch_size) const;
};


}  // namespace distjax::data
