// Byte-level text corpora for language modelling: the fortune files of the Debian
// `fortunes` packages (or any bytes), split by position into train and validation,
// and windows of T + 1 bytes cut into (inputs, next-byte targets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::data {

/// Where the Debian packages `fortunes` / `fortunes-min` put their text files.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

/// A corpus of bytes (vocabulary 256), split by position: the last `val_fraction` of
/// the bytes are the validation set.
struct ByteCorpus {
  std::vector<std::uint8_t> train;
  std::vector<std::uint8_t> validation;

  /// Splits `bytes` by position; both parts must end up non-empty.
  static ByteCorpus from_bytes(std::vector<std::uint8_t> bytes, double val_fraction = 0.05);
};

/// The plain-text files of `dir`, in lexicographic file-name order, concatenated;
/// ".dat" index files, ".u8" links and sub-directories are skipped. Throws IoError
/// naming the Debian package `fortunes` when the directory has no text file.
std::vector<std::uint8_t> read_text_files(const std::string& dir = kFortunesDir);

/// read_text_files(dir) split with ByteCorpus::from_bytes.
ByteCorpus load_fortunes(const std::string& dir = kFortunesDir, double val_fraction = 0.05);

/// B windows of T + 1 bytes at uniform random offsets drawn from `key`: inputs are
/// bytes [o, o + T), labels bytes [o + 1, o + T + 1); both (B, T) i32.
train::Batch sample_windows(const std::vector<std::uint8_t>& bytes, std::int64_t batch_size,
                            std::int64_t seq_len, const Key& key);

/// Consecutive non-overlapping windows from the start of `bytes` (for a fixed
/// validation set), grouped into batches of `batch_size`; at most `max_batches`
/// batches (0 = as many as fit). Every batch is full.
std::vector<train::Batch> sequential_windows(const std::vector<std::uint8_t>& bytes,
                                             std::int64_t batch_size, std::int64_t seq_len,
                                             std::int64_t max_batches = 0);

/// A fixed evaluation set that describes the whole split: of its consecutive windows (one
/// every seq_len bytes), all of them in full batches where they fit in `max_batches`
/// batches (or max_batches is 0), else max_batches batches of windows spread evenly over
/// the split (window j * W / N of W, for the N = max_batches * batch_size taken). The same
/// set on every run with the same split, batch size and length.
std::vector<train::Batch> spread_windows(const std::vector<std::uint8_t>& bytes,
                                         std::int64_t batch_size, std::int64_t seq_len,
                                         std::int64_t max_batches = 0);

}  // namespace distjax::data
