// Batch: the inputs and labels of one training or evaluation step.
// Shapes: classifier (B, 784) f32 inputs, (B) i32 labels; language model (B, T) i32 both.
#pragma once

#include <cstdint>

#include "distjax/tensor/tensor.hpp"

namespace distjax::train {

using tensor::Tensor;

/// One batch. Dimension 0 of both tensors is the batch dimension B.
struct Batch {
  Tensor inputs;  ///< (B, ...) model inputs
  Tensor labels;  ///< (B, ...) targets

  /// B; throws InvalidArgument if inputs and labels disagree on it.
  std::int64_t size() const;
  /// Examples [begin, end) of the batch, sharing storage (no copy).
  Batch slice(std::int64_t begin, std::int64_t end) const;
};

}  // namespace distjax::train
