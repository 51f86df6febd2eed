// Token shards for language modelling: files of token ids made once from a corpus (by
// llm.c's or nanoGPT's prepare scripts, or write_llmc_shard below), memory-mapped and read
// as one stream of tokens, cut into windows of T + 1 tokens as the byte corpora are.
//
// Two layouts, told apart by the first four bytes:
//   llm.c's .bin shards: a header of 256 little-endian int32 (magic 20240520, version 1
//     for uint16 tokens or 2 for uint32, the token count), then the tokens;
//   raw token files (nanoGPT's train.bin): little-endian uint16 (or uint32) tokens, no header.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::data {

/// llm.c's shard header: 256 int32, of which the first three are used.
inline constexpr std::int32_t kLlmcShardMagic = 20240520;
inline constexpr std::int64_t kLlmcHeaderBytes = 256 * 4;

/// One file of a TokenShards: where it is, how its tokens are stored, how many.
struct TokenFile {
  std::string path;
  bool llmc_header = false;  ///< llm.c's .bin layout (else raw tokens)
  int token_bytes = 2;       ///< 2 (uint16) or 4 (uint32)
  std::int64_t tokens = 0;
};

/// The token files of one split, memory-mapped read-only (the kernel pages them in as the
/// windows touch them; nothing is copied up front) and read as their concatenation in
/// file-name order. A file is mapped when a read first needs it and unmapped when
/// kMappedFiles others have been read since, so a process holds only the files its steps
/// read (with data::WindowOrder's file-by-file epochs: at most two at a time). Thread-safe
/// reads. Move-only.
///
///   const TokenShards train = TokenShards::open("data/fineweb_train_*.bin", "data.train");
///   train::Batch b = sample_windows(train, 8, 1024, key);   // (8, 1024) i32 inputs, labels
class TokenShards {
 public:
  /// Opens every file the glob `pattern` matches, in sorted order. A file that starts with
  /// llm.c's magic is read in its layout (version 1: uint16 tokens, 2: uint32); any other
  /// file as raw tokens of `raw_token_bytes` bytes (2 or 4). Errors name the file and
  /// `key` (the config key that named the pattern): ConfigError for a pattern that matches
  /// no file; IoError for a file that cannot be read or mapped, an llm.c header with another
  /// version, a body shorter or longer than its header's token count, a raw file whose size
  /// is not a multiple of the token size, or a split with no token.
  static TokenShards open(const std::string& pattern, const std::string& key,
                          int raw_token_bytes = 2);

  TokenShards(TokenShards&&) noexcept;
  TokenShards& operator=(TokenShards&&) noexcept;
  ~TokenShards();

  /// Tokens in all the files together.
  std::int64_t size() const { return size_; }
  /// Token i of the concatenation (0 <= i < size()).
  std::int64_t at(std::int64_t i) const;
  /// Tokens [begin, begin + n) of the concatenation, widened to i32, into out (a window
  /// may span two files).
  void read(std::int64_t begin, std::int64_t n, std::int32_t* out) const;
  /// The largest token id (one pass over every token on the first call, each file mapped
  /// for its pass alone, then kept): what model.vocab must exceed.
  std::int64_t max_token() const;
  /// The largest token of a share of the files, and the first file that holds it.
  struct Largest {
    std::int64_t token = -1;  ///< -1: the share has no token
    std::size_t file = 0;     ///< index into files()
  };
  /// The files i with i % parts == part, one pass over each (mapped for it alone): a
  /// process's share of the vocabulary check, so that under MPI no process reads every file
  /// before the first step (max_token() is the share 0 of 1).
  Largest largest_token(std::size_t part, std::size_t parts) const;
  /// Files kept mapped for reading at most.
  static constexpr std::size_t kMappedFiles = 4;
  /// The files mapped now (indices into files(), sorted).
  std::vector<std::size_t> mapped_files() const;
  /// How many times a file was mapped for reading (a file unmapped and read again counts
  /// again).
  std::int64_t mappings_made() const;
  const std::vector<TokenFile>& files() const { return files_; }
  /// The pattern and key it was opened with, for messages.
  const std::string& key() const { return key_; }

  struct Mapping;

 private:
  TokenShards() = default;
  std::shared_ptr<const Mapping> mapping(std::size_t file) const;
  // The files mapped now, the most recently read last.
  struct Cache {
    std::mutex mu;
    std::vector<std::shared_ptr<const Mapping>> maps;  // one per file; null: not mapped
    std::vector<std::size_t> recent;
    std::int64_t mapped = 0;
  };
  std::vector<TokenFile> files_;
  std::unique_ptr<Cache> cache_;
  std::vector<std::int64_t> starts_;            // first token of each file in the stream
  std::int64_t size_ = 0;
  std::string key_;
  mutable std::int64_t max_token_ = -1;
};

/// Where sample_windows(tokens, B, T, key) takes its B windows from: offsets in
/// [0, size - T) drawn from `key`, window i's from key.bits(i) (the byte corpora's rule).
/// InvalidArgument when a window is longer than the split.
std::vector<std::int64_t> random_starts(const TokenShards& tokens, std::int64_t batch_size,
                                        std::int64_t seq_len, const Key& key);

/// B windows of T + 1 tokens at uniform random offsets drawn from `key` (the rule of the
/// byte corpora's sample_windows: window i's offset from key.bits(i)): inputs tokens
/// [o, o + T), labels [o + 1, o + T + 1); both (B, T) i32 on the current device. A window may
/// cross from one file into the next. InvalidArgument when a window is longer than the split.
train::Batch sample_windows(const TokenShards& tokens, std::int64_t batch_size,
                            std::int64_t seq_len, const Key& key);

/// Consecutive non-overlapping windows from the first token (a fixed validation set),
/// grouped into full batches of `batch_size`; at most `max_batches` (0: as many as fit).
std::vector<train::Batch> sequential_windows(const TokenShards& tokens, std::int64_t batch_size,
                                             std::int64_t seq_len, std::int64_t max_batches = 0);

/// A fixed evaluation set that describes the whole split, as the byte corpora's
/// spread_windows: all windows where they fit in max_batches batches, else max_batches
/// batches of windows spread evenly over the split.
std::vector<train::Batch> spread_windows(const TokenShards& tokens, std::int64_t batch_size,
                                         std::int64_t seq_len, std::int64_t max_batches = 0);

/// Writes `tokens` as one llm.c shard at `path` (version 1 when every token fits uint16,
/// else 2), as llm.c's prepare scripts write it: for tests and small corpora.
void write_llmc_shard(const std::string& path, const std::vector<std::int64_t>& tokens);

/// A text corpus as byte-level llm.c shards in `out_dir` (made if missing): its training
/// split as train_000000.bin, train_000001.bin, ... of at most `shard_tokens` tokens each,
/// its validation split as val_000000.bin, ...; each byte one token (vocabulary 256, so
/// bits per token are bits per byte). Returns the files written, in order.
std::vector<std::string> write_byte_shards(const std::vector<std::uint8_t>& train,
                                           const std::vector<std::uint8_t>& validation,
                                           const std::string& out_dir,
                                           std::int64_t shard_tokens = std::int64_t{100} << 20);

}  // namespace distjax::data
