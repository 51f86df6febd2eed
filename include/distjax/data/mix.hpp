// Several token sources mixed by weight: each global batch holds a fixed number of rows of
// each source, in proportion to the weights (Megatron's blending of datasets, with the
// proportion met at every step rather than over the run).
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/data/token_shards.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::data {

/// The rows of each source in a global batch of `batch_size` for relative `weights`
/// (integers >= 1): batch_size * w_i / sum(w) rounded down, the rows left over going to the
/// largest remainders (the earlier source on a tie). InvalidArgument when a weight is below
/// 1 or a source would get no row (the batch is too small for the proportions).
///
///   data::mix_rows({3, 1}, 16);   // {12, 4}
///   data::mix_rows({1, 1, 1}, 8); // {3, 3, 2}
std::vector<std::int64_t> mix_rows(const std::vector<std::int64_t>& weights,
                                   std::int64_t batch_size);

/// A window of one of several sources: where it starts in that source.
struct SourceWindow {
  std::size_t source = 0;
  std::int64_t start = 0;
};

/// The windows (T + 1 tokens each, from their own source) as one batch: inputs and labels
/// (n, T) i32 on the current device, in the order given (at least one).
train::Batch windows_at(const std::vector<const TokenShards*>& sources,
                        const std::vector<SourceWindow>& windows, std::int64_t seq_len);

}  // namespace distjax::data
