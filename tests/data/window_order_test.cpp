// The epochs' order of a text split's windows (data.order = "epochs"): every window once per
// epoch, disjoint windows across data ranks that together cover the epoch, the same stream
// of global batches for any number of ranks, shuffled by the key and differently each
// epoch, and the windows' tokens where their starts say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/data/token_shards.hpp"
#include "distjax/data/window_order.hpp"

using namespace distjax;
using data::WindowOrder;

namespace {

constexpr std::int64_t kPositions = 1000, kSeq = 10, kBatch = 8;  // 99 windows, 12 batches

TEST(WindowOrder, EveryWindowOnceAnEpochDisjointAcrossRanks) {
  const WindowOrder order(kPositions, kSeq, kBatch, Key::from_seed(1));
  EXPECT_EQ(order.windows(), 99);
  EXPECT_EQ(order.batches_per_epoch(), 12);
  for (int ranks : {1, 2, 4, 8}) {
    std::vector<std::set<std::int64_t>> seen(static_cast<std::size_t>(ranks));
    std::set<std::int64_t> all;
    for (std::int64_t step = 0; step < order.batches_per_epoch(); ++step)
      for (int r = 0; r < ranks; ++r)
        for (std::int64_t s : order.starts(step, r, ranks)) {
          EXPECT_EQ(s % kSeq, 0);
          EXPECT_LE(s + kSeq + 1, kPositions);  // the window and its last label fit
          EXPECT_TRUE(all.insert(s).second) << "window at " << s << " read twice in an epoch";
          seen[static_cast<std::size_t>(r)].insert(s);
        }
    EXPECT_EQ(all.size(), 96u) << ranks << " ranks";  // 12 batches of 8: 3 windows left out
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(seen[static_cast<std::size_t>(r)].size(), 96u / static_cast<std::size_t>(ranks));
  }
}

TEST(WindowOrder, TheSameStreamOfGlobalBatchesForAnyNumberOfRanks) {
  const WindowOrder order(kPositions, kSeq, kBatch, Key::from_seed(2));
  for (std::int64_t step = 0; step < 40; ++step) {  // across three epochs
    const std::vector<std::int64_t> one = order.starts(step);
    for (int ranks : {2, 4, 8}) {
      std::vector<std::int64_t> joined;
      for (int r = 0; r < ranks; ++r) {
        const std::vector<std::int64_t> mine = order.starts(step, r, ranks);
        joined.insert(joined.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(joined, one) << "step " << step << ", " << ranks << " ranks";
    }
  }
  EXPECT_THROW(order.starts(0, 0, 3), InvalidArgument);  // 3 does not divide 8
}

TEST(WindowOrder, ShuffledByTheKeyAndAnewEachEpoch) {
  const WindowOrder a(kPositions, kSeq, kBatch, Key::from_seed(3));
  const WindowOrder same(kPositions, kSeq, kBatch, Key::from_seed(3));
  const WindowOrder other(kPositions, kSeq, kBatch, Key::from_seed(4));
  const std::vector<std::int64_t> e0 = *a.epoch_order(0), e1 = *a.epoch_order(1);
  std::vector<std::int64_t> identity(e0.size());
  for (std::size_t i = 0; i < identity.size(); ++i)
    identity[i] = static_cast<std::int64_t>(i);
  EXPECT_TRUE(std::is_permutation(e0.begin(), e0.end(), identity.begin()));
  EXPECT_NE(e0, identity);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(*same.epoch_order(1), e1);
  EXPECT_NE(*other.epoch_order(0), e0);
  // The batch of step 12 is the first of epoch 1.
  const std::vector<std::int64_t> s12 = a.starts(12);
  for (std::size_t i = 0; i < s12.size(); ++i)
    EXPECT_EQ(s12[i], e1[i] * kSeq);
}

TEST(WindowOrder, TooFewWindowsForABatchIsRefused) {
  EXPECT_THROW(WindowOrder(50, 10, 8, Key::from_seed(0)), InvalidArgument);  // 4 windows
  EXPECT_THROW(WindowOrder(1000, 0, 8, Key::from_seed(0)), InvalidArgument);
}

TEST(WindowOrder, WindowsAtReadTheTokensAndTheirNextTokens) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("distjax_window_order_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::int64_t> tokens(300);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int64_t>((i * 7) % 1000);
  data::write_llmc_shard((dir / "a.bin").string(), {tokens.begin(), tokens.begin() + 130});
  data::write_llmc_shard((dir / "b.bin").string(), {tokens.begin() + 130, tokens.end()});
  const data::TokenShards shards = data::TokenShards::open((dir / "*.bin").string(), "data.train");
  std::vector<std::uint8_t> bytes(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    bytes[i] = static_cast<std::uint8_t>(tokens[i] & 0xff);
  const std::vector<std::int64_t> starts = {120, 0, 280};  // 120: across the two files
  const train::Batch t = data::windows_at(shards, starts, 16);
  const train::Batch b = data::windows_at(bytes, starts, 16);
  ASSERT_EQ(t.inputs.shape(), Shape({3, 16}));
  const auto x = t.inputs.to_vector<std::int32_t>(), y = t.labels.to_vector<std::int32_t>();
  const auto bx = b.inputs.to_vector<std::int32_t>(), by = b.labels.to_vector<std::int32_t>();
  for (std::size_t r = 0; r < starts.size(); ++r)
    for (std::size_t i = 0; i < 16; ++i) {
      const auto at = static_cast<std::size_t>(starts[r]) + i;
      EXPECT_EQ(x[r * 16 + i], tokens[at]);
      EXPECT_EQ(y[r * 16 + i], tokens[at + 1]);
      EXPECT_EQ(bx[r * 16 + i], bytes[at]);
      EXPECT_EQ(by[r * 16 + i], bytes[at + 1]);
    }
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// Files of 300, 207, 1 and 493 positions with T = 10: 29, 20, 0 and 49 windows (98).
const std::vector<std::int64_t> kFiles = {300, 207, 1, 493};

// The file a position is in, and whether [s, s + T + 1) stays inside it.
std::pair<int, bool> file_of(std::int64_t s) {
  std::int64_t start = 0;
  for (std::size_t f = 0; f < kFiles.size(); ++f) {
    if (s < start + kFiles[f]) return {static_cast<int>(f), s + kSeq + 1 <= start + kFiles[f]};
    start += kFiles[f];
  }
  return {-1, false};
}

}  // namespace

TEST(WindowOrder, FilesAreReadOneAfterAnotherEachWindowInsideItsFile) {
  const WindowOrder order(kFiles, kSeq, kBatch, Key::from_seed(3));
  EXPECT_EQ(order.windows(), 98);
  std::set<std::vector<int>> file_orders;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<std::int64_t> all;
    std::vector<int> files_in_order;  // each file's first appearance
    for (std::int64_t b = 0; b < order.batches_per_epoch(); ++b) {
      const std::int64_t step = epoch * order.batches_per_epoch() + b;
      std::set<int> of_batch;
      for (int r = 0; r < 2; ++r)
        for (std::int64_t s : order.starts(step, r, 2)) {
          const auto [f, inside] = file_of(s);
          EXPECT_TRUE(inside) << "window at " << s << " crosses out of file " << f;
          EXPECT_TRUE(all.insert(s).second) << "window at " << s << " read twice";
          of_batch.insert(f);
          if (files_in_order.empty() || files_in_order.back() != f) files_in_order.push_back(f);
        }
      // A batch needs one file, or two at a border.
      EXPECT_LE(of_batch.size(), 2u) << "step " << step;
    }
    EXPECT_EQ(all.size(), 96u);
    // Each file read in one stretch: no file comes back once left.
    std::set<int> distinct(files_in_order.begin(), files_in_order.end());
    EXPECT_EQ(distinct.size(), files_in_order.size()) << "epoch " << epoch;
    file_orders.insert(files_in_order);
  }
  EXPECT_GT(file_orders.size(), 1u);  // the files' order is shuffled anew each epoch
}

TEST(WindowOrder, OneFileReadsAsTheSplitItIs) {
  const WindowOrder split(kPositions, kSeq, kBatch, Key::from_seed(4));
  const WindowOrder file({kPositions}, kSeq, kBatch, Key::from_seed(4));
  for (std::int64_t step = 0; step < 30; ++step) EXPECT_EQ(split.starts(step), file.starts(step));
}
