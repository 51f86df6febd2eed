#include "distjax/data/window_order.hpp"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/token_window.hpp"
#include "distjax/data/detail/windows.hpp"

namespace distjax::data {

namespace {

// The windows of a file of `positions` (T + 1 positions each, one every T).
std::int64_t windows_of(std::int64_t positions, std::int64_t seq_len) {
  return seq_len > 0 && positions > 1 ? (positions - 1) / seq_len : 0;
}

// Fisher-Yates over v, swap partner of position i from key.bits(i).
void shuffle(std::int64_t* v, std::int64_t n, const Key& key) {
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto w = key.bits(static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::int64_t>(((std::uint64_t{w[0]} << 32) | w[1]) %
                                             static_cast<std::uint64_t>(i + 1));
    std::swap(v[i], v[j]);
  }
}

}  // namespace

WindowOrder::WindowOrder(std::int64_t positions, std::int64_t seq_len, std::int64_t batch_size,
                         Key key)
    : WindowOrder(std::vector<std::int64_t>{positions}, seq_len, batch_size, key) {}

WindowOrder::WindowOrder(const std::vector<std::int64_t>& file_positions, std::int64_t seq_len,
                         std::int64_t batch_size, Key key)
    : seq_len_(seq_len),
      batch_size_(batch_size),
      windows_(0),
      key_(key.fold_in(std::string_view("window_order"))) {
  DISTJAX_CHECK(seq_len > 0 && batch_size > 0, InvalidArgument,
                "[WindowOrder] seq_len and batch_size must be >= 1, got ", seq_len, " and ",
                batch_size);
  std::int64_t position = 0;
  for (std::int64_t p : file_positions) {
    file_starts_.push_back(position);
    file_windows_.push_back(windows_);
    position += p;
    windows_ += windows_of(p, seq_len);
  }
  file_windows_.push_back(windows_);
  DISTJAX_CHECK(windows_ >= batch_size, InvalidArgument, "[WindowOrder] a split of ", position,
                " positions holds ", windows_, " windows of ", seq_len,
                " + 1, fewer than one batch of ", batch_size);
}

std::shared_ptr<const std::vector<std::int64_t>> WindowOrder::epoch_order(
    std::int64_t epoch) const {
  const std::lock_guard lock(mu_);
  if (epoch == cached_epoch_) return cached_;
  auto order = std::make_shared<std::vector<std::int64_t>>(static_cast<std::size_t>(windows_));
  const Key k = key_.fold_in(static_cast<std::uint64_t>(epoch));
  const auto files = static_cast<std::int64_t>(file_starts_.size());
  if (files == 1) {
    std::iota(order->begin(), order->end(), std::int64_t{0});
    shuffle(order->data(), windows_, k);
  } else {
    // The files in a shuffled order, each file's windows shuffled within it.
    std::vector<std::int64_t> file_order(static_cast<std::size_t>(files));
    std::iota(file_order.begin(), file_order.end(), std::int64_t{0});
    shuffle(file_order.data(), files, k.fold_in(std::string_view("files")));
    std::int64_t* out = order->data();
    for (std::int64_t f : file_order) {
      const std::int64_t first = file_windows_[static_cast<std::size_t>(f)];
      const std::int64_t n = file_windows_[static_cast<std::size_t>(f) + 1] - first;
      std::iota(out, out + n, first);
      shuffle(out, n, k.fold_in(static_cast<std::uint64_t>(f)));
      out += n;
    }
  }
  cached_epoch_ = epoch;
  cached_ = std::move(order);
  return cached_;
}

std::int64_t WindowOrder::start_of(std::int64_t window) const {
  const auto f = static_cast<std::size_t>(
      std::upper_bound(file_windows_.begin(), file_windows_.end(), window) -
      file_windows_.begin() - 1);
  return file_starts_[f] + (window - file_windows_[f]) * seq_len_;
}

std::vector<std::int64_t> WindowOrder::starts(std::int64_t step, int rank, int ranks) const {
  DISTJAX_CHECK(step >= 0 && ranks >= 1 && rank >= 0 && rank < ranks && batch_size_ % ranks == 0,
                InvalidArgument, "[WindowOrder] rank ", rank, " of ", ranks, " at step ", step,
                ": the ranks must divide the batch of ", batch_size_);
  const std::int64_t per_epoch = batches_per_epoch();
  const auto order = epoch_order(step / per_epoch);
  const std::int64_t rows = batch_size_ / ranks;
  const std::int64_t first = (step % per_epoch) * batch_size_ + rank * rows;
  std::vector<std::int64_t> out(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    out[static_cast<std::size_t>(i)] = start_of((*order)[static_cast<std::size_t>(first + i)]);
  return out;
}

train::Batch windows_at(const TokenShards& tokens, const std::vector<std::int64_t>& starts,
                        std::int64_t seq_len) {
  const auto n = static_cast<std::int64_t>(starts.size());
  return detail::batches_at(starts, n, seq_len, detail::token_window(tokens, seq_len))[0];
}

train::Batch windows_at(const std::vector<std::uint8_t>& bytes,
                        const std::vector<std::int64_t>& starts, std::int64_t seq_len) {
  const auto n = static_cast<std::int64_t>(starts.size());
  return detail::batches_at(starts, n, seq_len,
                            [&](std::int64_t o, std::int32_t* x, std::int32_t* y) {
                              for (std::int64_t t = 0; t < seq_len; ++t) {
                                x[t] = bytes[static_cast<std::size_t>(o + t)];
                                y[t] = bytes[static_cast<std::size_t>(o + t + 1)];
                              }
                            })[0];
}

}  // namespace distjax::data
