#include "distjax/data/window_order.hpp"

#include <numeric>
#include <string_view>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/windows.hpp"

namespace distjax::data {

WindowOrder::WindowOrder(std::int64_t positions, std::int64_t seq_len, std::int64_t batch_size,
                         Key key)
    : seq_len_(seq_len),
      batch_size_(batch_size),
      windows_(seq_len > 0 && positions > 1 ? (positions - 1) / seq_len : 0),
      key_(key.fold_in(std::string_view("window_order"))) {
  DISTJAX_CHECK(seq_len > 0 && batch_size > 0, InvalidArgument,
                "[WindowOrder] seq_len and batch_size must be >= 1, got ", seq_len, " and ",
                batch_size);
  DISTJAX_CHECK(windows_ >= batch_size, InvalidArgument, "[WindowOrder] a split of ", positions,
                " positions holds ", windows_, " windows of ", seq_len,
                " + 1, fewer than one batch of ", batch_size);
}

std::shared_ptr<const std::vector<std::int64_t>> WindowOrder::epoch_order(
    std::int64_t epoch) const {
  const std::lock_guard lock(mu_);
  if (epoch == cached_epoch_) return cached_;
  // Fisher-Yates, swap partner of position i from the epoch key's bits(i).
  auto order = std::make_shared<std::vector<std::int64_t>>(static_cast<std::size_t>(windows_));
  std::iota(order->begin(), order->end(), std::int64_t{0});
  const Key k = key_.fold_in(static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = windows_ - 1; i > 0; --i) {
    const auto w = k.bits(static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::int64_t>(((std::uint64_t{w[0]} << 32) | w[1]) %
                                             static_cast<std::uint64_t>(i + 1));
    std::swap((*order)[static_cast<std::size_t>(i)], (*order)[static_cast<std::size_t>(j)]);
  }
  cached_epoch_ = epoch;
  cached_ = std::move(order);
  return cached_;
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
    out[static_cast<std::size_t>(i)] = (*order)[static_cast<std::size_t>(first + i)] * seq_len_;
  return out;
}

train::Batch windows_at(const TokenShards& tokens, const std::vector<std::int64_t>& starts,
                        std::int64_t seq_len) {
  std::vector<std::int32_t> scratch(static_cast<std::size_t>(seq_len + 1));
  const auto n = static_cast<std::int64_t>(starts.size());
  return detail::batches_at(starts, n, seq_len,
                            [&](std::int64_t o, std::int32_t* x, std::int32_t* y) {
                              tokens.read(o, seq_len + 1, scratch.data());
                              std::copy(scratch.begin(), scratch.end() - 1, x);
                              std::copy(scratch.begin() + 1, scratch.end(), y);
                            })[0];
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
