// Token shards: llm.c's .bin layout (written here byte by byte, independently of the
// library's writer) and raw token files read back token for token, windows cut from the
// stream across files, and bad files refused naming the file and the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/data/token_shards.hpp"

namespace fs = std::filesystem;
using namespace distjax;
using data::TokenShards;

namespace {

// A fresh directory per test, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("distjax_token_shards_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k)
    out.push_back(static_cast<unsigned char>(v >> (8 * k)));
}

// llm.c's layout, as its dev/data scripts write it: 256 int32 (magic, version, count, zeros),
// then the tokens.
void write_llmc(const std::string& path, const std::vector<std::uint32_t>& tokens, int version = 1,
                std::int64_t count_in_header = -1) {
  std::vector<unsigned char> out;
  put_le(out, 20240520, 4);
  put_le(out, static_cast<std::uint32_t>(version), 4);
  put_le(out, static_cast<std::uint32_t>(count_in_header < 0 ? tokens.size() : count_in_header), 4);
  out.resize(1024, 0);
  for (std::uint32_t t : tokens)
    put_le(out, t, version == 1 ? 2 : 4);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
}

void write_raw(const std::string& path, const std::vector<std::uint32_t>& tokens, int width) {
  std::vector<unsigned char> out;
  for (std::uint32_t t : tokens)
    put_le(out, t, width);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
}

std::vector<std::uint32_t> iota_tokens(std::uint32_t first, int n, std::uint32_t step = 7) {
  std::vector<std::uint32_t> v;
  for (int i = 0; i < n; ++i)
    v.push_back((first + step * static_cast<std::uint32_t>(i)) % 50257);
  return v;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST(TokenShards, LlmcShardsReadBackTokenForTokenAcrossFiles) {
  TempDir dir;
  const std::vector<std::uint32_t> a = iota_tokens(3, 1000), b = iota_tokens(50000, 37);
  write_llmc(dir / "fineweb_train_000001.bin", b);  // sorted by name: _000000 first
  write_llmc(dir / "fineweb_train_000000.bin", a);
  write_llmc(dir / "fineweb_val_000000.bin", iota_tokens(1, 10));  // not matched
  const TokenShards t = TokenShards::open(dir / "fineweb_train_*.bin", "data.train");
  ASSERT_EQ(t.files().size(), 2u);
  EXPECT_TRUE(t.files()[0].llmc_header);
  EXPECT_EQ(t.files()[0].token_bytes, 2);
  EXPECT_EQ(t.size(), 1037);
  std::vector<std::uint32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  for (std::int64_t i = 0; i < t.size(); ++i)
    ASSERT_EQ(t.at(i), all[i]) << i;
  std::vector<std::int32_t> window(20);
  t.read(990, 20, window.data());  // ten of each file
  for (int k = 0; k < 20; ++k)
    EXPECT_EQ(window[k], static_cast<std::int32_t>(all[990 + k]));
  std::uint32_t max = 0;
  for (std::uint32_t v : all)
    max = std::max(max, v);
  EXPECT_EQ(t.max_token(), max);
  EXPECT_THROW(t.at(1037), InvalidArgument);
}

TEST(TokenShards, VersionTwoAndRawFilesOfBothWidths) {
  TempDir dir;
  const std::vector<std::uint32_t> big = {70000, 5, 128000, 0};
  write_llmc(dir / "llama.bin", big, /*version=*/2);
  const TokenShards v2 = TokenShards::open(dir / "llama.bin", "data.train");
  EXPECT_EQ(v2.files()[0].token_bytes, 4);
  EXPECT_EQ(v2.size(), 4);
  EXPECT_EQ(v2.at(2), 128000);

  write_raw(dir / "train.bin", {1, 2, 65535, 4}, 2);  // nanoGPT's uint16 train.bin
  const TokenShards raw16 = TokenShards::open(dir / "train.bin", "data.train");
  EXPECT_FALSE(raw16.files()[0].llmc_header);
  EXPECT_EQ(raw16.size(), 4);
  EXPECT_EQ(raw16.at(2), 65535);
  write_raw(dir / "wide.u32", {100000, 3}, 4);
  const TokenShards raw32 = TokenShards::open(dir / "wide.u32", "data.train", 4);
  EXPECT_EQ(raw32.size(), 2);
  EXPECT_EQ(raw32.at(0), 100000);
}

TEST(TokenShards, WindowsAreTheStreamShiftedByOne) {
  TempDir dir;
  const std::vector<std::uint32_t> a = iota_tokens(11, 300), b = iota_tokens(4000, 300, 13);
  write_llmc(dir / "s0.bin", a);
  write_llmc(dir / "s1.bin", b);
  const TokenShards t = TokenShards::open(dir / "s*.bin", "data.train");
  std::vector<std::uint32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  const Key key = Key::from_seed(5);
  const train::Batch w = data::sample_windows(t, 16, 32, key);
  ASSERT_EQ(w.inputs.shape(), (Shape{16, 32}));
  const std::vector<std::int32_t> x = w.inputs.to(Device::cpu()).to_vector<std::int32_t>();
  const std::vector<std::int32_t> y = w.labels.to(Device::cpu()).to_vector<std::int32_t>();
  for (int i = 0; i < 16; ++i) {
    // Where the window starts in the stream (the first match of its first two tokens).
    std::int64_t o = -1;
    for (std::size_t s = 0; s + 32 < all.size() && o < 0; ++s)
      if (static_cast<std::int32_t>(all[s]) == x[i * 32] &&
          static_cast<std::int32_t>(all[s + 1]) == x[i * 32 + 1])
        o = static_cast<std::int64_t>(s);
    ASSERT_GE(o, 0) << "window " << i << " is not in the stream";
    for (int k = 0; k < 32; ++k) {
      EXPECT_EQ(x[i * 32 + k], static_cast<std::int32_t>(all[o + k]));
      EXPECT_EQ(y[i * 32 + k], static_cast<std::int32_t>(all[o + k + 1]));
    }
  }
  // The same key, the same windows; another key, others.
  EXPECT_EQ(data::sample_windows(t, 16, 32, key).inputs.to(Device::cpu()).to_vector<std::int32_t>(),
            x);
  EXPECT_NE(data::sample_windows(t, 16, 32, Key::from_seed(6))
                .inputs.to(Device::cpu())
                .to_vector<std::int32_t>(),
            x);
  // Sequential windows: consecutive from the first token, full batches only.
  const std::vector<train::Batch> seq = data::sequential_windows(t, 4, 50, 0);
  ASSERT_EQ(seq.size(), 2u);  // (600 - 1) / 50 = 11 windows: two batches of 4
  const std::vector<std::int32_t> s1 = seq[1].inputs.to(Device::cpu()).to_vector<std::int32_t>();
  EXPECT_EQ(s1[0], static_cast<std::int32_t>(all[200]));
  EXPECT_EQ(seq[1].labels.to(Device::cpu()).to_vector<std::int32_t>()[199],
            static_cast<std::int32_t>(all[400]));
  EXPECT_EQ(data::sequential_windows(t, 4, 50, 1).size(), 1u);
  // Spread: 1 batch of 4 of the 11 windows, windows 0, 2, 5 and 8 (j * 11 / 4).
  const std::vector<train::Batch> spread = data::spread_windows(t, 4, 50, 1);
  ASSERT_EQ(spread.size(), 1u);
  const std::vector<std::int32_t> sx = spread[0].inputs.to(Device::cpu()).to_vector<std::int32_t>();
  for (int w = 0; w < 4; ++w)
    EXPECT_EQ(sx[w * 50], static_cast<std::int32_t>(all[std::vector<int>{0, 2, 5, 8}[w] * 50]));
}

TEST(TokenShards, BadFilesAreRefusedNamingTheFileAndTheKey) {
  TempDir dir;
  EXPECT_THROW(TokenShards::open(dir / "none_*.bin", "data.train"), ConfigError);
  EXPECT_NE(message_of([&] {
              TokenShards::open(dir / "none_*.bin", "data.val");
            }).find("data.val = \"" + (dir / "none_*.bin") + "\" matches no file"),
            std::string::npos);

  write_llmc(dir / "v3.bin", {1, 2, 3}, /*version=*/3);
  const std::string v3 = message_of([&] { TokenShards::open(dir / "v3.bin", "data.train"); });
  EXPECT_NE(v3.find("v3.bin (data.train): llm.c shard version 3"), std::string::npos) << v3;

  write_llmc(dir / "cut.bin", iota_tokens(0, 100), 1, /*count_in_header=*/120);
  const std::string cut = message_of([&] { TokenShards::open(dir / "cut.bin", "data.train"); });
  EXPECT_NE(cut.find("the header says 120 tokens of 2 bytes, the body holds 200 bytes"),
            std::string::npos)
      << cut;

  write_raw(dir / "odd.bin", {1, 2, 3}, 2);
  std::ofstream(dir / "odd.bin", std::ios::binary | std::ios::app).put('x');
  const std::string odd = message_of([&] { TokenShards::open(dir / "odd.bin", "data.train"); });
  EXPECT_NE(odd.find("7 bytes is not a whole number of 2-byte tokens"), std::string::npos) << odd;

  std::ofstream(dir / "empty.bin").close();
  EXPECT_NE(
      message_of([&] { TokenShards::open(dir / "empty.bin", "data.train"); }).find("is empty"),
      std::string::npos);

  write_llmc(dir / "short.bin", iota_tokens(0, 10));
  const TokenShards t = TokenShards::open(dir / "short.bin", "data.val");
  const std::string longer = message_of([&] { data::sample_windows(t, 1, 10, Key::from_seed(0)); });
  EXPECT_NE(longer.find("a window of 11 tokens (data.seq_len + 1) is longer than data.val, which "
                        "holds 10 tokens"),
            std::string::npos)
      << longer;
}

TEST(TokenShards, TheLibrarysWriterWritesWhatTheReaderReads) {
  TempDir dir;
  const std::vector<std::int64_t> small = {0, 1, 65535, 42};
  data::write_llmc_shard(dir / "small.bin", small);
  const TokenShards s = TokenShards::open(dir / "small.bin", "data.train");
  EXPECT_EQ(s.files()[0].token_bytes, 2);
  for (std::size_t i = 0; i < small.size(); ++i)
    EXPECT_EQ(s.at(static_cast<std::int64_t>(i)), small[i]);
  const std::vector<std::int64_t> wide = {65536, 7};
  data::write_llmc_shard(dir / "wide.bin", wide);
  const TokenShards w = TokenShards::open(dir / "wide.bin", "data.train");
  EXPECT_EQ(w.files()[0].token_bytes, 4);
  EXPECT_EQ(w.at(0), 65536);
  EXPECT_THROW(data::write_llmc_shard(dir / "neg.bin", {-1}), InvalidArgument);
}

// A file is mapped when first read and unmapped when kMappedFiles others were read since:
// reading windows file by file holds only the files read lately, never one not read.
TEST(TokenShards, FilesAreMappedWhileReadAndOnlyThese) {
  const fs::path dir = fs::temp_directory_path() / "distjax_token_shards_mapped";
  fs::remove_all(dir);
  fs::create_directories(dir);
  constexpr int kFiles = 7;
  for (int f = 0; f < kFiles; ++f) {
    std::vector<std::int64_t> tokens(100);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = 1000 * f + static_cast<std::int64_t>(i);
    data::write_llmc_shard((dir / ("s_" + std::to_string(f) + ".bin")).string(), tokens);
  }
  const data::TokenShards shards = data::TokenShards::open((dir / "s_*.bin").string(), "data.train");
  EXPECT_TRUE(shards.mapped_files().empty());  // opening maps nothing for reading
  EXPECT_EQ(shards.max_token(), 6099);
  EXPECT_TRUE(shards.mapped_files().empty());  // nor does the vocabulary's pass
  // A process's share of that pass (file f holds 1000 f .. 1000 f + 99): files f % parts == part.
  const auto largest = [&](std::size_t part, std::size_t parts) {
    const data::TokenShards::Largest l = shards.largest_token(part, parts);
    return std::pair{l.token, l.file};
  };
  EXPECT_EQ(largest(0, 1), (std::pair<std::int64_t, std::size_t>{6099, 6}));
  EXPECT_EQ(largest(1, 2), (std::pair<std::int64_t, std::size_t>{5099, 5}));  // files 1, 3, 5
  EXPECT_EQ(largest(0, 2), (std::pair<std::int64_t, std::size_t>{6099, 6}));  // 0, 2, 4, 6
  EXPECT_EQ(largest(2, 6), (std::pair<std::int64_t, std::size_t>{2099, 2}));  // file 2 alone
  EXPECT_EQ(largest(7, 8).first, -1);                                        // no file
  EXPECT_THROW(shards.largest_token(2, 2), InvalidArgument);
  EXPECT_TRUE(shards.mapped_files().empty());
  std::vector<std::int32_t> w(11);
  shards.read(120, 11, w.data());  // file 1
  EXPECT_EQ(w[0], 1020);
  EXPECT_EQ(shards.mapped_files(), (std::vector<std::size_t>{1}));
  shards.read(295, 11, w.data());  // the end of file 2 and the start of file 3
  EXPECT_EQ(w[4], 2099);
  EXPECT_EQ(w[5], 3000);
  EXPECT_EQ(shards.mapped_files(), (std::vector<std::size_t>{1, 2, 3}));
  for (std::int64_t at : {410, 520, 630})  // files 4, 5, 6: 1 and 2 go
    shards.read(at, 11, w.data());
  EXPECT_EQ(shards.mapped_files(), (std::vector<std::size_t>{3, 4, 5, 6}));
  EXPECT_EQ(shards.mappings_made(), 6);  // file 0 never
  shards.read(130, 11, w.data());         // file 1 again: mapped anew
  EXPECT_EQ(w[0], 1030);
  EXPECT_EQ(shards.mappings_made(), 7);
  fs::remove_all(dir);
}
