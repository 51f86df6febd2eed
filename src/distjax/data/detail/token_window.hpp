// The fill of one window of a token split for detail::batches_at: tokens [o, o + T + 1) read
// once, the first T as the inputs row, the last T as the labels row (shared by the token
// shards' sampled, sequential and ordered windows and by mixed sources).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace distjax::data::detail {

// fill(o, x, y) over `t` (a TokenShards, which must outlive it), with its own scratch row.
// A template, so that this header needs not include the shards' (which use it).
template <class Tokens>
auto token_window(const Tokens& t, std::int64_t seq_len) {
  return [&t, seq_len, scratch = std::vector<std::int32_t>(static_cast<std::size_t>(seq_len + 1))](
             std::int64_t o, std::int32_t* x, std::int32_t* y) mutable {
    t.read(o, seq_len + 1, scratch.data());
    std::copy(scratch.begin(), scratch.end() - 1, x);
    std::copy(scratch.begin() + 1, scratch.end(), y);
  };
}

}  // namespace distjax::data::detail
