// Token shards: the files of a glob memory-mapped and read as one stream of tokens.
#include "distjax/data/token_shards.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <filesystem>
#include <fstream>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/on_device.hpp"
#include "distjax/data/detail/token_window.hpp"
#include "distjax/data/detail/windows.hpp"

namespace distjax::data {

using tensor::Tensor;

// One file mapped read-only while it is read (TokenShards::mapping keeps the last few).
struct TokenShards::Mapping {
  const unsigned char* base = nullptr;
  std::size_t bytes = 0;
  const unsigned char* tokens = nullptr;  // the first token (past any header)
  int token_bytes = 2;

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr) munmap(const_cast<unsigned char*>(base), bytes);
  }
  std::int64_t at(std::int64_t i) const {
    const unsigned char* p = tokens + i * token_bytes;
    if (token_bytes == 2) return std::int64_t{p[0]} | std::int64_t{p[1]} << 8;
    return std::int64_t{p[0]} | std::int64_t{p[1]} << 8 | std::int64_t{p[2]} << 16 |
           std::int64_t{p[3]} << 24;
  }
};

namespace {

std::string where(const std::string& path, const std::string& key) {
  return path + " (" + key + ")";
}

std::int32_t le32(const unsigned char* p) {
  return static_cast<std::int32_t>(std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 |
                                   std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24);
}

std::vector<std::string> glob_files(const std::string& pattern, const std::string& key) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i)
      out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  DISTJAX_CHECK(rc == 0 || rc == GLOB_NOMATCH, IoError, "[token shards] ", key, " = \"", pattern,
                "\": cannot list the files (",
                rc == GLOB_ABORTED ? "a directory cannot be read" : "glob failed", ")");
  DISTJAX_CHECK(!out.empty(), ConfigError, "[token shards] ", key, " = \"", pattern,
                "\" matches no file (`distjax data prepare --out DIR` writes a directory of "
                "text as shards)");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

namespace {

// File `path` mapped read-only, whole (the kernel pages it in as it is read).
std::shared_ptr<TokenShards::Mapping> map_file(const std::string& path, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DISTJAX_CHECK(fd >= 0, IoError, "[token shards] cannot open ", where(path, key), ": ",
                std::strerror(errno));
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  const int stat_errno = errno;
  auto m = std::make_shared<TokenShards::Mapping>();
  m->bytes = stat_ok ? static_cast<std::size_t>(st.st_size) : 0;
  if (stat_ok && m->bytes > 0) {
    void* p = mmap(nullptr, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) m->base = static_cast<const unsigned char*>(p);
  }
  const int map_errno = errno;
  ::close(fd);
  DISTJAX_CHECK(stat_ok, IoError, "[token shards] cannot read ", where(path, key), ": ",
                std::strerror(stat_errno));
  DISTJAX_CHECK(m->bytes > 0, IoError, "[token shards] ", where(path, key), " is empty");
  DISTJAX_CHECK(m->base != nullptr, IoError, "[token shards] cannot map ", where(path, key), ": ",
                std::strerror(map_errno));
  return m;
}

// File f mapped to read its tokens (past any header).
std::shared_ptr<TokenShards::Mapping> map_tokens(const TokenFile& f, const std::string& key) {
  std::shared_ptr<TokenShards::Mapping> m = map_file(f.path, key);
  m->tokens = m->base + (f.llmc_header ? kLlmcHeaderBytes : 0);
  m->token_bytes = f.token_bytes;
  return m;
}

}  // namespace

TokenShards TokenShards::open(const std::string& pattern, const std::string& key,
                              int raw_token_bytes) {
  DISTJAX_CHECK(raw_token_bytes == 2 || raw_token_bytes == 4, InvalidArgument,
                "[token shards] raw tokens are 2 or 4 bytes wide, got ", raw_token_bytes);
  TokenShards s;
  s.key_ = key;
  s.cache_ = std::make_unique<Cache>();
  for (const std::string& path : glob_files(pattern, key)) {
    // Mapped to read and check the layout, unmapped again: a file is mapped while read.
    const std::shared_ptr<Mapping> m = map_file(path, key);
    TokenFile f{path, false, raw_token_bytes, 0};
    const auto size = static_cast<std::int64_t>(m->bytes);
    if (size >= 4 && le32(m->base) == kLlmcShardMagic) {
      DISTJAX_CHECK(size >= kLlmcHeaderBytes, IoError, "[token shards] ", where(path, key),
                    ": llm.c shard of ", size, " bytes, shorter than its 1024-byte header");
      const std::int32_t version = le32(m->base + 4);
      DISTJAX_CHECK(version == 1 || version == 2, IoError, "[token shards] ", where(path, key),
                    ": llm.c shard version ", version,
                    " (known: 1, uint16 tokens; 2, uint32 tokens)");
      f.llmc_header = true;
      f.token_bytes = version == 1 ? 2 : 4;
      f.tokens = le32(m->base + 8);
      const std::int64_t body = size - kLlmcHeaderBytes;
      DISTJAX_CHECK(f.tokens >= 0 && body == f.tokens * f.token_bytes, IoError, "[token shards] ",
                    where(path, key), ": the header says ", f.tokens, " tokens of ", f.token_bytes,
                    " bytes, the body holds ", body, " bytes (a truncated or damaged shard)");
    } else {
      DISTJAX_CHECK(size % raw_token_bytes == 0, IoError, "[token shards] ", where(path, key), ": ",
                    size, " bytes is not a whole number of ", raw_token_bytes,
                    "-byte tokens (no llm.c header: read as raw tokens)");
      f.tokens = size / raw_token_bytes;
    }
    s.starts_.push_back(s.size_);
    s.size_ += f.tokens;
    s.files_.push_back(std::move(f));
  }
  s.cache_->maps.resize(s.files_.size());
  DISTJAX_CHECK(s.size_ > 0, IoError, "[token shards] ", key, " = \"", pattern,
                "\": its files hold no token");
  return s;
}

std::shared_ptr<const TokenShards::Mapping> TokenShards::mapping(std::size_t f) const {
  const std::lock_guard lock(cache_->mu);
  auto& lru = cache_->recent;
  if (const auto& m = cache_->maps[f]) {
    lru.erase(std::find(lru.begin(), lru.end(), f));
    lru.push_back(f);
    return m;
  }
  std::shared_ptr<const Mapping> m = map_tokens(files_[f], key_);
  cache_->maps[f] = m;
  lru.push_back(f);
  ++cache_->mapped;
  // The least recently read go (unmapped once no reader holds them).
  while (lru.size() > kMappedFiles) {
    cache_->maps[lru.front()].reset();
    lru.erase(lru.begin());
  }
  return m;
}

std::vector<std::size_t> TokenShards::mapped_files() const {
  const std::lock_guard lock(cache_->mu);
  std::vector<std::size_t> out = cache_->recent;
  std::sort(out.begin(), out.end());
  return out;
}

std::int64_t TokenShards::mappings_made() const {
  const std::lock_guard lock(cache_->mu);
  return cache_->mapped;
}

TokenShards::TokenShards(TokenShards&&) noexcept = default;
TokenShards& TokenShards::operator=(TokenShards&&) noexcept = default;
TokenShards::~TokenShards() = default;

std::int64_t TokenShards::at(std::int64_t i) const {
  DISTJAX_CHECK(i >= 0 && i < size_, InvalidArgument, "[token shards] token ", i,
                " out of range for ", size_, " tokens (", key_, ")");
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), i) - 1;
  const std::size_t f = static_cast<std::size_t>(it - starts_.begin());
  return mapping(f)->at(i - *it);
}

void TokenShards::read(std::int64_t begin, std::int64_t n, std::int32_t* out) const {
  DISTJAX_CHECK(begin >= 0 && n >= 0 && begin + n <= size_, InvalidArgument,
                "[token shards] tokens [", begin, ", ", begin + n, ") out of range for ", size_,
                " tokens (", key_, ")");
  if (n == 0) return;
  std::size_t f = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                           starts_.begin() - 1);
  std::int64_t i = begin - starts_[f];
  std::shared_ptr<const Mapping> m;
  for (std::int64_t k = 0; k < n; ++k, ++i) {
    while (i >= files_[f].tokens) {  // on into the next file (skipping empty ones)
      i -= files_[f].tokens;
      ++f;
      m.reset();
    }
    if (!m) m = mapping(f);
    out[k] = static_cast<std::int32_t>(m->at(i));
  }
}

std::int64_t TokenShards::max_token() const {
  if (max_token_ < 0) max_token_ = largest_token(0, 1).token;
  return max_token_;
}

TokenShards::Largest TokenShards::largest_token(std::size_t part, std::size_t parts) const {
  DISTJAX_CHECK(parts >= 1 && part < parts, InvalidArgument, "[TokenShards::largest_token] share ",
                part, " of ", parts, " does not exist");
  Largest best;
  for (std::size_t f = part; f < files_.size(); f += parts) {
    // A pass over each file, mapped for it alone (not kept for reading).
    const std::shared_ptr<const Mapping> m = map_tokens(files_[f], key_);
    for (std::int64_t i = 0; i < files_[f].tokens; ++i)
      if (const std::int64_t t = m->at(i); t > best.token) best = {t, f};
  }
  return best;
}

namespace {

void check_window(const TokenShards& t, std::int64_t batch_size, std::int64_t seq_len,
                  const char* op) {
  DISTJAX_CHECK(batch_size >= 1 && seq_len >= 1, InvalidArgument, "[", op,
                "] batch_size and seq_len must be positive, got ", batch_size, " and ", seq_len);
  DISTJAX_CHECK(t.size() >= seq_len + 1, InvalidArgument, "[", op, "] a window of ", seq_len + 1,
                " tokens (data.seq_len + 1) is longer than ", t.key(), ", which holds ", t.size(),
                " tokens");
}

}  // namespace

std::vector<std::int64_t> random_starts(const TokenShards& tokens, std::int64_t batch_size,
                                        std::int64_t seq_len, const Key& key) {
  check_window(tokens, batch_size, seq_len, "random_starts");
  return detail::random_window_starts(key, tokens.size(), seq_len, batch_size);
}

train::Batch sample_windows(const TokenShards& tokens, std::int64_t batch_size,
                            std::int64_t seq_len, const Key& key) {
  check_window(tokens, batch_size, seq_len, "sample_windows");
  return detail::batches_at(random_starts(tokens, batch_size, seq_len, key), batch_size, seq_len,
                            detail::token_window(tokens, seq_len))[0];
}

std::vector<train::Batch> sequential_windows(const TokenShards& tokens, std::int64_t batch_size,
                                             std::int64_t seq_len, std::int64_t max_batches) {
  check_window(tokens, batch_size, seq_len, "sequential_windows");
  return detail::batches_at(
      detail::consecutive_window_starts(tokens.size(), seq_len, batch_size, max_batches, false),
      batch_size, seq_len, detail::token_window(tokens, seq_len));
}

std::vector<train::Batch> spread_windows(const TokenShards& tokens, std::int64_t batch_size,
                                         std::int64_t seq_len, std::int64_t max_batches) {
  check_window(tokens, batch_size, seq_len, "spread_windows");
  return detail::batches_at(
      detail::consecutive_window_starts(tokens.size(), seq_len, batch_size, max_batches, true),
      batch_size, seq_len, detail::token_window(tokens, seq_len));
}

void write_llmc_shard(const std::string& path, const std::vector<std::int64_t>& tokens) {
  std::int64_t max = 0;
  for (std::int64_t t : tokens) {
    DISTJAX_CHECK(t >= 0 && t <= 0xFFFFFFFFLL, InvalidArgument, "[write_llmc_shard] token ", t,
                  " does not fit a uint32");
    max = std::max(max, t);
  }
  DISTJAX_CHECK(tokens.size() <= 0x7FFFFFFFu, InvalidArgument,
                "[write_llmc_shard] an llm.c shard holds at most 2^31 - 1 tokens, got ",
                tokens.size());
  const int width = max <= 0xFFFF ? 2 : 4;
  std::vector<unsigned char> out(static_cast<std::size_t>(kLlmcHeaderBytes) +
                                 tokens.size() * static_cast<std::size_t>(width));
  const auto put32 = [&](std::size_t at, std::uint32_t v) {
    for (int k = 0; k < 4; ++k)
      out[at + k] = static_cast<unsigned char>(v >> (8 * k));
  };
  put32(0, static_cast<std::uint32_t>(kLlmcShardMagic));
  put32(4, width == 2 ? 1 : 2);
  put32(8, static_cast<std::uint32_t>(tokens.size()));
  std::size_t at = static_cast<std::size_t>(kLlmcHeaderBytes);
  for (std::int64_t t : tokens)
    for (int k = 0; k < width; ++k)
      out[at++] = static_cast<unsigned char>(static_cast<std::uint64_t>(t) >> (8 * k));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  DISTJAX_CHECK(f.good(), IoError, "[write_llmc_shard] cannot write ", path);
}

std::vector<std::string> write_byte_shards(const std::vector<std::uint8_t>& train,
                                           const std::vector<std::uint8_t>& validation,
                                           const std::string& out_dir,
                                           std::int64_t shard_tokens) {
  DISTJAX_CHECK(shard_tokens >= 1, InvalidArgument,
                "[write_byte_shards] shard_tokens must be positive, got ", shard_tokens);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  DISTJAX_CHECK(!ec, IoError, "[write_byte_shards] cannot create ", out_dir, ": ", ec.message());
  std::vector<std::string> written;
  for (const auto& [name, bytes] : {std::pair{"train", &train}, std::pair{"val", &validation}}) {
    const auto n = static_cast<std::int64_t>(bytes->size());
    for (std::int64_t at = 0, k = 0; at < n; at += shard_tokens, ++k) {
      char file[32];
      std::snprintf(file, sizeof file, "%s_%06lld.bin", name, static_cast<long long>(k));
      const std::int64_t end = std::min(n, at + shard_tokens);
      const std::string path = (std::filesystem::path(out_dir) / file).string();
      write_llmc_shard(path, {bytes->begin() + at, bytes->begin() + end});
      written.push_back(path);
    }
  }
  return written;
}

}  // namespace distjax::data
