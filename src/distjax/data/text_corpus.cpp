#include "distjax/data/text_corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/on_device.hpp"
#include "distjax/data/detail/windows.hpp"

namespace distjax::data {

namespace fs = std::filesystem;
using tensor::Tensor;

ByteCorpus ByteCorpus::from_bytes(std::vector<std::uint8_t> bytes, double val_fraction) {
  DISTJAX_CHECK(val_fraction > 0.0 && val_fraction < 1.0, InvalidArgument,
                "[ByteCorpus] val_fraction must lie in (0, 1), got ", val_fraction);
  const auto n = static_cast<std::int64_t>(bytes.size());
  const auto n_val = static_cast<std::int64_t>(static_cast<double>(n) * val_fraction);
  DISTJAX_CHECK(n_val >= 1 && n - n_val >= 1, InvalidArgument, "[ByteCorpus] ", n,
                " bytes are too few to split with val_fraction ", val_fraction);
  ByteCorpus c;
  c.validation.assign(bytes.end() - n_val, bytes.end());
  bytes.resize(static_cast<std::size_t>(n - n_val));
  c.train = std::move(bytes);
  return c;
}

std::vector<std::uint8_t> read_text_files(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const fs::path& p = e.path();
      const std::string ext = p.extension().string();
      if (ext == ".dat" || ext == ".u8") continue;           // strfile indexes, UTF-8 links
      if (e.is_symlink() || !e.is_regular_file()) continue;  // links duplicate other files
      files.push_back(p);
    }
  }
  DISTJAX_CHECK(!files.empty(), IoError, "[read_text_files] no text files in \"", dir,
                "\"; install the Debian package `fortunes` (apt-get install fortunes) or pass "
                "a directory of text files");
  std::sort(files.begin(), files.end());  // deterministic order on every file system
  std::vector<std::uint8_t> out;
  for (const auto& p : files) {
    std::ifstream f(p, std::ios::binary);
    DISTJAX_CHECK(f.good(), IoError, "[read_text_files] cannot read \"", p.string(), "\"");
    out.insert(out.end(), std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return out;
}

ByteCorpus load_fortunes(const std::string& dir, double val_fraction) {
  return ByteCorpus::from_bytes(read_text_files(dir), val_fraction);
}

namespace {
void check_window(const std::vector<std::uint8_t>& bytes, std::int64_t batch_size,
                  std::int64_t seq_len, const char* op) {
  DISTJAX_CHECK(batch_size >= 1 && seq_len >= 1, InvalidArgument, "[", op,
                "] batch_size and seq_len must be >= 1, got ", batch_size, " and ", seq_len);
  DISTJAX_CHECK(static_cast<std::int64_t>(bytes.size()) >= seq_len + 1, InvalidArgument, "[", op,
                "] ", bytes.size(), " bytes are too few for windows of ", seq_len + 1);
}

// Window [o, o + T + 1) of the bytes into an inputs row (the first T) and a labels row.
auto bytes_window(const std::vector<std::uint8_t>& bytes, std::int64_t seq_len) {
  return [&bytes, seq_len](std::int64_t o, std::int32_t* x, std::int32_t* y) {
    const std::uint8_t* src = bytes.data() + o;
    for (std::int64_t t = 0; t < seq_len; ++t) {
      x[t] = src[t];
      y[t] = src[t + 1];
    }
  };
}
}  // namespace

train::Batch sample_windows(const std::vector<std::uint8_t>& bytes, std::int64_t batch_size,
                            std::int64_t seq_len, const Key& key) {
  check_window(bytes, batch_size, seq_len, "sample_windows");
  const auto size = static_cast<std::int64_t>(bytes.size());
  return detail::batches_at(detail::random_window_starts(key, size, seq_len, batch_size),
                            batch_size, seq_len, bytes_window(bytes, seq_len))[0];
}

std::vector<train::Batch> sequential_windows(const std::vector<std::uint8_t>& bytes,
                                             std::int64_t batch_size, std::int64_t seq_len,
                                             std::int64_t max_batches) {
  check_window(bytes, batch_size, seq_len, "sequential_windows");
  const auto size = static_cast<std::int64_t>(bytes.size());
  return detail::batches_at(
      detail::consecutive_window_starts(size, seq_len, batch_size, max_batches, false),
      batch_size, seq_len, bytes_window(bytes, seq_len));
}

std::vector<train::Batch> spread_windows(const std::vector<std::uint8_t>& bytes,
                                         std::int64_t batch_size, std::int64_t seq_len,
                                         std::int64_t max_batches) {
  check_window(bytes, batch_size, seq_len, "spread_windows");
  const auto size = static_cast<std::int64_t>(bytes.size());
  return detail::batches_at(
      detail::consecutive_window_starts(size, seq_len, batch_size, max_batches, true),
      batch_size, seq_len, bytes_window(bytes, seq_len));
}

}  // namespace distjax::data
