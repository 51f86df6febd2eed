#include "distjax/data/loader.hpp"

#include <numeric>

#include "distjax/core/error.hpp"

namespace distjax::data {

std::vector<std::int64_t> random_permutation(std::int64_t n, const Key& key) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  for (std::int64_t i = n - 1; i > 0; --i) {
    auto w = key.bits(static_cast<std::uint64_t>(i));
    const std::uint64_t r = (std::uint64_t{w[0]} << 32) | w[1];
    const auto j = static_cast<std::int64_t>(r % static_cast<std::uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

DataLoader::DataLoader(ArrayDataset dataset, LoaderConfig config)
    : dataset_(std::move(dataset)), config_(config) {
  const std::int64_t n = dataset_.size();
  DISTJAX_CHECK(config_.batch_size >= 1, InvalidArgument,
                "[DataLoader] batch_size must be >= 1, got ", config_.batch_size);
  DISTJAX_CHECK(config_.num_shards >= 1 && 0 <= config_.shard_index &&
                    config_.shard_index < config_.num_shards,
                InvalidArgument, "[DataLoader] shard_index ", config_.shard_index,
                " is not in [0, num_shards = ", config_.num_shards, ")");
  DISTJAX_CHECK(config_.batch_size % config_.num_shards == 0, InvalidArgument,
                "[DataLoader] batch_size ", config_.batch_size, " is not divisible by num_shards ",
                config_.num_shards);
  DISTJAX_CHECK(config_.num_shards == 1 || config_.drop_last, InvalidArgument,
                "[DataLoader] sharded loading needs drop_last (every shard gets equal batches)");
  DISTJAX_CHECK(batches_per_epoch() >= 1, InvalidArgument, "[DataLoader] ", n,
                " examples make no full batch of ", config_.batch_size);
}

std::int64_t DataLoader::batches_per_epoch() const {
  const std::int64_t n = dataset_.size();
  return config_.drop_last ? n / config_.batch_size
                           : (n + config_.batch_size - 1) / config_.batch_size;
}

std::vector<std::int64_t> DataLoader::epoch_order(std::int64_t epoch) const {
  const std::int64_t n = dataset_.size();
  if (!config_.shuffle) {
    std::vector<std::int64_t> p(static_cast<std::size_t>(n));
    std::iota(p.begin(), p.end(), std::int64_t{0});
    return p;
  }
  return random_permutation(
      n, Key::from_seed(config_.seed).fold_in(static_cast<std::uint64_t>(epoch)));
}

void DataLoader::seek(LoaderPosition pos) {
  DISTJAX_CHECK(pos.epoch >= 0 && pos.batch >= 0 && pos.batch < batches_per_epoch(),
                InvalidArgument, "[DataLoader::seek] position (epoch ", pos.epoch, ", batch ",
                pos.batch, ") is invalid; an epoch has ", batches_per_epoch(), " batches");
  pos_ = pos;
}

train::Batch DataLoader::next() {
  if (order_epoch_ != pos_.epoch) {
    order_ = epoch_order(pos_.epoch);
    order_epoch_ = pos_.epoch;
  }
  const std::int64_t n = dataset_.size();
  const std::int64_t begin = pos_.batch * config_.batch_size;
  const std::int64_t end = std::min(n, begin + config_.batch_size);
  const std::int64_t per_shard = (end - begin) / config_.num_shards;
  const std::int64_t lo = begin + config_.shard_index * per_shard;
  std::vector<std::int64_t> idx(order_.begin() + lo, order_.begin() + lo + per_shard);
  if (++pos_.batch == batches_per_epoch()) {
    pos_.batch = 0;
    ++pos_.epoch;
  }
  return dataset_.gather(idx);
}

}  // namespace distjax::data
