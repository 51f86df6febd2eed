// Packed documents: windows of a token stream whose documents end in an end-of-text token,
// with what the GPT needs to keep its loss and attention within each document.
#pragma once

#include <cstdint>

#include "distjax/train/batch.hpp"

namespace distjax::data {

/// The windows `b` (inputs, labels (B, T) i32/i64, next-token targets) as packed documents
/// ending in the token `eot` (>= 0): Batch::documents (B, T) i32, the number of eot tokens
/// strictly before each position in its row (an eot belongs to the document it ends), and
/// the labels of the positions whose input is the eot set to train::kIgnoreLabel (the next
/// document's first token, which nothing in its own document predicts). On b's device; the
/// inputs are read on the host (no copy when they are there).
///
///   train::Batch packed = data::pack_documents(data::windows_at(train, starts, 1024), 50256);
///   // tokens 7 9 E 4 5 -> documents 0 0 0 1 1; the label at the E is ignored
train::Batch pack_documents(const train::Batch& b, std::int64_t eot);

}  // namespace distjax::data
