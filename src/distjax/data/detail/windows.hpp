// The windows of a text split as batches (shared by the byte corpora and the token shards):
// where the windows start (random from a key, consecutive from the start, or spread over the
// whole split), and the batches of the windows at given starts.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/data/detail/on_device.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::data::detail {

// batch_size windows at offsets in [0, positions - seq_len) drawn from `key`: window i's
// from key.bits(i).
inline std::vector<std::int64_t> random_window_starts(const Key& key, std::int64_t positions,
                                                      std::int64_t seq_len,
                                                      std::int64_t batch_size) {
  const auto offsets = static_cast<std::uint64_t>(positions - seq_len);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(batch_size));
  for (std::int64_t i = 0; i < batch_size; ++i) {
    const auto w = key.bits(static_cast<std::uint64_t>(i));
    starts[static_cast<std::size_t>(i)] =
        static_cast<std::int64_t>(((std::uint64_t{w[0]} << 32) | w[1]) % offsets);
  }
  return starts;
}

// The split's consecutive windows (one every seq_len positions, each seq_len + 1 long), W of
// them, in full batches: the first max_batches batches (all with 0) where `spread` is false;
// where it is true, all of them if they fit in max_batches batches, else max_batches *
// batch_size of them spread evenly over the whole split (window j * W / N for j < N).
inline std::vector<std::int64_t> consecutive_window_starts(std::int64_t positions,
                                                           std::int64_t seq_len,
                                                           std::int64_t batch_size,
                                                           std::int64_t max_batches, bool spread) {
  const std::int64_t windows = (positions - 1) / seq_len;
  std::int64_t n = windows / batch_size * batch_size;
  const bool fewer = max_batches > 0 && max_batches * batch_size < n;
  if (fewer) n = max_batches * batch_size;
  std::vector<std::int64_t> starts(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j)
    starts[static_cast<std::size_t>(j)] = (fewer && spread ? j * windows / n : j) * seq_len;
  return starts;
}

// The windows at `starts` (a multiple of batch_size of them) as batches of batch_size:
// inputs and labels (B, T) i32 filled on the host by fill(start, inputs_row, labels_row),
// then handed to the current device with one copy each.
template <class Fill>
std::vector<train::Batch> batches_at(const std::vector<std::int64_t>& starts,
                                     std::int64_t batch_size, std::int64_t seq_len, Fill&& fill) {
  std::vector<train::Batch> out;
  for (std::size_t at = 0; at < starts.size(); at += static_cast<std::size_t>(batch_size)) {
    train::Batch b{tensor::Tensor::empty({batch_size, seq_len}, DType::I32, Device::cpu()),
                   tensor::Tensor::empty({batch_size, seq_len}, DType::I32, Device::cpu())};
    for (std::int64_t i = 0; i < batch_size; ++i)
      fill(starts[at + static_cast<std::size_t>(i)], b.inputs.data<std::int32_t>() + i * seq_len,
           b.labels.data<std::int32_t>() + i * seq_len);
    out.push_back(to_current_device(b));
  }
  return out;
}

}  // namespace distjax::data::detail
