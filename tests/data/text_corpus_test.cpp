#include "distjax/data/text_corpus.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "distjax/core/error.hpp"

namespace distjax::data {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(ByteCorpus, SplitsByPosition) {
  std::vector<std::uint8_t> b(100);
  for (int i = 0; i < 100; ++i)
    b[i] = static_cast<std::uint8_t>(i);
  ByteCorpus c = ByteCorpus::from_bytes(b, 0.05);
  ASSERT_EQ(c.train.size(), 95u);
  ASSERT_EQ(c.validation.size(), 5u);
  EXPECT_EQ(c.train.back(), 94);
  EXPECT_EQ(c.validation.front(), 95);
  EXPECT_THROW(ByteCorpus::from_bytes(bytes_of("abc"), 0.05), InvalidArgument);
}

TEST(ReadTextFiles, SortedPlainFilesOnly) {
  const fs::path dir = fs::temp_directory_path() / "distjax_text_corpus_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
  };
  write("b", "BBB");
  write("a", "AA");
  write("a.dat", "index");
  write("sub/c", "nested");
  fs::create_symlink("a", dir / "a.u8");
  fs::create_symlink("b", dir / "link");
  EXPECT_EQ(read_text_files(dir.string()), bytes_of("AABBB"));
  fs::remove_all(dir);
  try {
    read_text_files(dir.string());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("fortunes"), std::string::npos) << e.what();
  }
}

TEST(SampleWindows, TargetsAreInputsShiftedByOne) {
  std::vector<std::uint8_t> b(50);
  for (int i = 0; i < 50; ++i)
    b[i] = static_cast<std::uint8_t>(i * 3);
  train::Batch batch = sample_windows(b, 6, 8, Key::from_seed(1));
  EXPECT_EQ(batch.inputs.shape(), (Shape{6, 8}));
  EXPECT_EQ(batch.labels.dtype(), DType::I32);
  auto x = batch.inputs.to_vector<std::int32_t>();
  auto y = batch.labels.to_vector<std::int32_t>();
  std::set<std::int32_t> starts;
  for (int i = 0; i < 6; ++i) {
    const int off = x[i * 8] / 3;
    starts.insert(off);
    EXPECT_LE(off + 8, 49);
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(x[i * 8 + t], (off + t) * 3);
      EXPECT_EQ(y[i * 8 + t], (off + t + 1) * 3);
    }
  }
  EXPECT_GT(starts.size(), 1u);  // random offsets
  // Same key, same batch; another key, another batch.
  EXPECT_EQ(sample_windows(b, 6, 8, Key::from_seed(1)).inputs.to_vector<std::int32_t>(), x);
  EXPECT_NE(sample_windows(b, 6, 8, Key::from_seed(2)).inputs.to_vector<std::int32_t>(), x);
  EXPECT_THROW(sample_windows(b, 1, 50, Key()), InvalidArgument);
}

TEST(SequentialWindows, CoverTheTextInOrder) {
  std::vector<std::uint8_t> b(23);
  for (int i = 0; i < 23; ++i)
    b[i] = static_cast<std::uint8_t>(i);
  // (23 - 1) / 5 = 4 windows -> 2 batches of 2.
  auto batches = sequential_windows(b, 2, 5);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].inputs.to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(batches[1].labels.to_vector<std::int32_t>().back(), 20);
  EXPECT_EQ(sequential_windows(b, 2, 5, 1).size(), 1u);
}

// An evaluation set spread over the whole split: every window where they fit, else windows
// evenly spaced from the first to near the last (the first batches alone describe a slice).
TEST(SpreadWindows, AllWindowsWhenTheyFitElseEvenlySpreadOverTheSplit) {
  std::vector<std::uint8_t> b(201);
  for (int i = 0; i < 201; ++i)
    b[i] = static_cast<std::uint8_t>(i);
  // (201 - 1) / 10 = 20 windows starting at 0, 10, ..., 190.
  auto firsts = [](const std::vector<train::Batch>& batches) {
    std::vector<std::int32_t> out;
    for (const train::Batch& x : batches) {
      const std::vector<std::int32_t> v = x.inputs.to_vector<std::int32_t>();
      for (std::size_t i = 0; i < v.size(); i += 10) out.push_back(v[i]);
    }
    return out;
  };
  EXPECT_EQ(firsts(spread_windows(b, 4, 10, 5)), firsts(sequential_windows(b, 4, 10)));
  EXPECT_EQ(firsts(spread_windows(b, 4, 10, 0)).size(), 20u);
  // 2 batches of 4 = 8 of the 20 windows: window j * 20 / 8.
  const std::vector<train::Batch> spread = spread_windows(b, 4, 10, 2);
  ASSERT_EQ(spread.size(), 2u);
  EXPECT_EQ(firsts(spread), (std::vector<std::int32_t>{0, 20, 50, 70, 100, 120, 150, 170}));
  EXPECT_EQ(spread[1].labels.to_vector<std::int32_t>().back(), 180);
}

TEST(Fortunes, RealCorpusIfInstalled) {
  if (!fs::exists(fs::path(kFortunesDir) / "fortunes")) {
    GTEST_SKIP() << "no fortune files in " << kFortunesDir << " (Debian package fortunes)";
  }
  ByteCorpus c = load_fortunes();
  EXPECT_GT(c.train.size(), 100000u);
  EXPECT_NEAR(static_cast<double>(c.validation.size()) / (c.train.size() + c.validation.size()),
              0.05, 1e-3);
  // Fortunes are separated by lines holding a single '%'.
  const std::string text(c.train.begin(), c.train.begin() + 20000);
  EXPECT_NE(text.find("\n%\n"), std::string::npos);
}

}  // namespace
}  // namespace distjax::data
