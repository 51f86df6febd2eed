#include "distjax/data/mix.hpp"

#include <algorithm>
#include <numeric>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/token_window.hpp"
#include "distjax/data/detail/windows.hpp"

namespace distjax::data {

std::vector<std::int64_t> mix_rows(const std::vector<std::int64_t>& weights,
                                   std::int64_t batch_size) {
  DISTJAX_CHECK(!weights.empty(), InvalidArgument, "[mix_rows] no source");
  for (std::int64_t w : weights)
    DISTJAX_CHECK(w >= 1, InvalidArgument, "[mix_rows] weights must be integers >= 1, got ", w);
  const std::int64_t total = std::accumulate(weights.begin(), weights.end(), std::int64_t{0});
  const std::size_t n = weights.size();
  std::vector<std::int64_t> rows(n), remainder(n);
  for (std::size_t i = 0; i < n; ++i) {
    rows[i] = batch_size * weights[i] / total;
    remainder[i] = batch_size * weights[i] % total;
  }
  std::vector<std::size_t> by_remainder(n);
  std::iota(by_remainder.begin(), by_remainder.end(), std::size_t{0});
  std::stable_sort(by_remainder.begin(), by_remainder.end(),
                   [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  std::int64_t left = batch_size - std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
  for (std::size_t k = 0; left > 0; ++k, --left)
    ++rows[by_remainder[k]];
  for (std::size_t i = 0; i < n; ++i)
    DISTJAX_CHECK(rows[i] >= 1, InvalidArgument, "[mix_rows] source ", i, " (weight ", weights[i],
                  " of ", total, ") gets no row of a batch of ", batch_size,
                  ": raise its weight or the batch");
  return rows;
}

train::Batch windows_at(const std::vector<const TokenShards*>& sources,
                        const std::vector<SourceWindow>& windows, std::int64_t seq_len) {
  DISTJAX_CHECK(!windows.empty(), InvalidArgument, "[windows_at] no window");
  std::vector<std::int64_t> index(windows.size());
  std::iota(index.begin(), index.end(), std::int64_t{0});
  std::vector<decltype(detail::token_window(*sources[0], seq_len))> fill;
  for (const TokenShards* s : sources)
    fill.push_back(detail::token_window(*s, seq_len));
  return detail::batches_at(
      index, static_cast<std::int64_t>(index.size()), seq_len,
      [&](std::int64_t i, std::int32_t* x, std::int32_t* y) {
        const SourceWindow& w = windows[static_cast<std::size_t>(i)];
        DISTJAX_CHECK(w.source < sources.size(), InvalidArgument, "[windows_at] source ",
                      w.source, " of ", sources.size());
        fill[w.source](w.start, x, y);
      })[0];
}

}  // namespace distjax::data
