// Where the windows of a fixed evaluation set start in a split (shared by the byte corpora
// and the token shards).
#pragma once

#include <cstdint>
#include <vector>

namespace distjax::data::detail {

// The split's consecutive windows (one every seq_len positions, each seq_len + 1 long), W of
// them: all of them in full batches where max_batches is 0 or they fit in max_batches
// batches; else max_batches * batch_size of them spread evenly over the whole split (window
// j * W / N for j < N). Their start positions, in order.
inline std::vector<std::int64_t> spread_window_starts(std::int64_t positions, std::int64_t seq_len,
                                                      std::int64_t batch_size,
                                                      std::int64_t max_batches) {
  const std::int64_t windows = (positions - 1) / seq_len;
  std::int64_t n = windows / batch_size * batch_size;
  const bool spread = max_batches > 0 && max_batches * batch_size < n;
  if (spread) n = max_batches * batch_size;
  std::vector<std::int64_t> starts(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j)
    starts[static_cast<std::size_t>(j)] = (spread ? j * windows / n : j) * seq_len;
  return starts;
}

}  // namespace distjax::data::detail
