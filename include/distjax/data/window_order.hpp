// The order in which a text split's windows are read for training, epoch by epoch: every
// window once per epoch in an order shuffled by seed, each data rank its own rows of each
// global batch. The alternative to drawing windows at random offsets (sample_windows).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/data/token_shards.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::data {

/// A split of `positions` tokens (or bytes) cut into W consecutive windows (one every T
/// positions, each T + 1 long: inputs and next-position labels, as sequential_windows cuts
/// them), shuffled per epoch (a permutation drawn from key.fold_in(epoch)) and read in
/// global batches of B: the run's batch s is batch s % P of epoch s / P, P = W / B batches
/// per epoch (the last W % B windows of an epoch's order are left out of it). A data rank r
/// of R reads rows [r B / R, (r + 1) B / R) of each global batch: disjoint windows that
/// together cover the epoch, and the same stream of global batches on every mesh. It all
/// follows from the step, so a resumed run (on any mesh) reads what the uninterrupted run
/// would. Thread-safe (the devices of a process share one).
///
///   data::WindowOrder order(train.size(), 1024, 64, Key::from_seed(42));
///   train::Batch mine = data::windows_at(train, order.starts(step, rank, ranks), 1024);
class WindowOrder {
 public:
  /// InvalidArgument when the split holds fewer than B windows or B, T < 1.
  WindowOrder(std::int64_t positions, std::int64_t seq_len, std::int64_t batch_size, Key key);
  /// A split stored as files of these many positions each (a TokenShards' files, in order),
  /// read file by file as llm.c's shuffling loader reads shards: each epoch takes the files
  /// in an order shuffled from the epoch's key and each file's own windows (none crossing
  /// into the next file) in an order shuffled within it. A global batch then holds windows
  /// of one file, or two where it straddles their border, so the readers of a step need
  /// at most two files at a time (TokenShards maps files as they are read). One file: the
  /// order of the constructor above.
  WindowOrder(const std::vector<std::int64_t>& file_positions, std::int64_t seq_len,
              std::int64_t batch_size, Key key);

  std::int64_t windows() const { return windows_; }
  std::int64_t batches_per_epoch() const { return windows_ / batch_size_; }
  /// Where the windows of rank `rank` of `ranks` in global batch `step` start (positions),
  /// in row order. `ranks` must divide B (InvalidArgument otherwise).
  std::vector<std::int64_t> starts(std::int64_t step, int rank = 0, int ranks = 1) const;
  /// The order of epoch `epoch`: a permutation of the window indices [0, W) (window w of a
  /// file starts at the file's first position + (w - the file's first window) * T).
  std::shared_ptr<const std::vector<std::int64_t>> epoch_order(std::int64_t epoch) const;
  /// Where window `window` starts (a position of the split).
  std::int64_t start_of(std::int64_t window) const;

 private:
  std::int64_t seq_len_, batch_size_, windows_;
  std::vector<std::int64_t> file_starts_;   // first position of each file
  std::vector<std::int64_t> file_windows_;  // first window of each file, then W
  Key key_;
  mutable std::mutex mu_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<std::int64_t>> cached_;
};

/// The windows at `starts` (positions of T + 1 tokens each) as one batch: inputs and
/// labels (n, T) i32 on the current device.
train::Batch windows_at(const TokenShards& tokens, const std::vector<std::int64_t>& starts,
                        std::int64_t seq_len);
train::Batch windows_at(const std::vector<std::uint8_t>& bytes,
                        const std::vector<std::int64_t>& starts, std::int64_t seq_len);

}  // namespace distjax::data
