// DataLoader: a seeded, deterministic, resumable loader over an ArrayDataset that
// shuffles per epoch, batches, and hands each data-parallel rank its slice.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/data/array_dataset.hpp"

namespace distjax::data {

/// Options of a DataLoader.
struct LoaderConfig {
  std::int64_t batch_size = 32;  ///< global batch size (over all shards)
  bool shuffle = true;           ///< a new permutation each epoch, from seed and epoch
  std::uint64_t seed = 0;
  bool drop_last = true;  ///< drop the last incomplete batch of an epoch
  int num_shards = 1;     ///< data-parallel ranks sharing each global batch
  int shard_index = 0;    ///< this rank: rows [i * B / n, (i + 1) * B / n)
};

/// Where a loader is: the epoch and the index of the next batch within it.
struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t batch = 0;
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

/// Yields batches forever, epoch after epoch. The order depends only on (seed, epoch),
/// so a loader moved to a saved position with `seek` yields exactly what the original
/// would have.
///
///   DataLoader loader(train_set, {.batch_size = 128, .seed = 0});
///   train::Batch b = loader.next();        // inputs (128, 784), labels (128)
///   LoaderPosition pos = loader.position();  // store in a checkpoint
class DataLoader {
 public:
  DataLoader(ArrayDataset dataset, LoaderConfig config);

  /// The next batch (this shard's slice of the next global batch); advances the epoch
  /// when one ends.
  train::Batch next();
  /// Global batches per epoch.
  std::int64_t batches_per_epoch() const;
  LoaderPosition position() const { return pos_; }
  /// Moves to `pos` (any epoch; batch < batches_per_epoch()).
  void seek(LoaderPosition pos);
  /// The example order of `epoch` (identity when not shuffling).
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;
  const ArrayDataset& dataset() const { return dataset_; }
  const LoaderConfig& config() const { return config_; }

 private:
  ArrayDataset dataset_;
  LoaderConfig config_;
  LoaderPosition pos_;
  std::int64_t order_epoch_ = -1;  // epoch whose order is cached in order_
  std::vector<std::int64_t> order_;
};

/// A uniform random permutation of [0, n) (Fisher-Yates on the key's stream).
std::vector<std::int64_t> random_permutation(std::int64_t n, const Key& key);

}  // namespace distjax::data
