// Synthetic data sets for tests and benchmarks: a learnable classification task and
// learnable token sequences, generated from a key (same key, same data).
#pragma once

#include <cstdint>

#include "distjax/core/prng.hpp"
#include "distjax/data/array_dataset.hpp"

namespace distjax::data {

/// n examples of `features` standard-normal inputs (f32), labelled (i32) by a random
/// linear teacher: label = argmax(x @ W) with W (features, classes) from the key.
/// A linear model can fit it exactly, a small MLP quickly.
ArrayDataset synthetic_classification(std::int64_t n, std::int64_t features, std::int64_t classes,
                                      const Key& key);

/// n sequences of seq_len tokens (i32 in [0, vocab)) following a fixed random
/// permutation: token[t + 1] = perm[token[t]], from a random start. inputs (n, T),
/// labels (n, T) are the next tokens, so a model can reach near-zero loss.
ArrayDataset synthetic_tokens(std::int64_t n, std::int64_t seq_len, std::int64_t vocab,
                              const Key& key);

}  // namespace distjax::data
