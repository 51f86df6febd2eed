// Batch: the inputs and labels of one training or evaluation step.
// Shapes: classifier (B, 784) f32 inputs, (B) i32 labels; language model (B, T) i32 both,
// and with packed documents (B, T) i32 document ids.
#pragma once

#include <cstdint>

#include "distjax/tensor/tensor.hpp"

namespace distjax::train {

using tensor::Tensor;

/// A label the loss does not count (packed documents: a position whose input ends a
/// document, whose label is the next document's first token).
inline constexpr std::int32_t kIgnoreLabel = -1;

/// One batch. Dimension 0 of every tensor is the batch dimension B.
struct Batch {
  Tensor inputs;  ///< (B, ...) model inputs
  Tensor labels;  ///< (B, ...) targets
  /// Packed documents (data::pack_documents): (B, T) i32, the document of each position
  /// within its row. Defined when the windows pack documents: labels then hold kIgnoreLabel
  /// where the loss counts nothing, and a model may keep its attention within each
  /// document. Undefined otherwise.
  Tensor documents{};

  /// B; throws InvalidArgument if the tensors disagree on it.
  std::int64_t size() const;
  /// Examples [begin, end) of the batch, sharing storage (no copy).
  Batch slice(std::int64_t begin, std::int64_t end) const;
  /// The batch with `f` (Tensor -> Tensor) applied to each defined tensor: a copy onto a
  /// device, a mark of the mesh axes it varies over. Every tensor of the batch goes
  /// through it, so no part is left behind.
  template <class F>
  Batch map(F&& f) const {
    const auto each = [&](const Tensor& t) { return t.defined() ? f(t) : t; };
    return Batch{each(inputs), each(labels), each(documents)};
  }
};

}  // namespace distjax::train
