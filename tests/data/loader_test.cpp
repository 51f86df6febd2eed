#include "distjax/data/loader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "distjax/core/error.hpp"
#include "distjax/data/synthetic.hpp"

namespace distjax::data {
namespace {

// inputs[i] = (i, -i), labels[i] = i: a batch's labels tell which examples it holds.
ArrayDataset indexed(std::int64_t n) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(-static_cast<float>(i));
    y.push_back(static_cast<std::int32_t>(i));
  }
  return {Tensor::from_vector(x, {n, 2}), Tensor::from_vector(y, {n})};
}

std::vector<std::int32_t> ids(const train::Batch& b) {
  return b.labels.to_vector<std::int32_t>();
}

TEST(RandomPermutation, IsAPermutationAndDependsOnTheKey) {
  auto p = random_permutation(100, Key::from_seed(1));
  std::vector<std::int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 100; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(random_permutation(100, Key::from_seed(1)), p);
  EXPECT_NE(random_permutation(100, Key::from_seed(2)), p);
}

TEST(DataLoader, EpochVisitsEveryExampleOnceAndReshuffles) {
  DataLoader loader(indexed(12), {.batch_size = 4, .seed = 7});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  std::vector<std::int32_t> epoch0, epoch1;
  for (int i = 0; i < 3; ++i) {
    train::Batch b = loader.next();
    EXPECT_EQ(b.inputs.shape(), (Shape{4, 2}));
    // inputs and labels stay paired.
    auto x = b.inputs.to_vector<float>();
    auto y = ids(b);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(x[2 * r], static_cast<float>(y[r]));
    epoch0.insert(epoch0.end(), y.begin(), y.end());
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
  for (int i = 0; i < 3; ++i) {
    auto y = ids(loader.next());
    epoch1.insert(epoch1.end(), y.begin(), y.end());
  }
  EXPECT_EQ(std::set<std::int32_t>(epoch0.begin(), epoch0.end()).size(), 12u);
  EXPECT_NE(epoch0, epoch1);
  std::vector<std::int32_t> identity(12);
  for (int i = 0; i < 12; ++i)
    identity[i] = i;
  EXPECT_NE(epoch0, identity);
}

TEST(DataLoader, ResumesFromAPosition) {
  DataLoader a(indexed(20), {.batch_size = 3, .seed = 11});
  for (int i = 0; i < 8; ++i)
    a.next();  // 6 batches per epoch: now in epoch 1
  const LoaderPosition pos = a.position();
  EXPECT_EQ(pos, (LoaderPosition{1, 2}));
  std::vector<std::vector<std::int32_t>> rest;
  for (int i = 0; i < 7; ++i)
    rest.push_back(ids(a.next()));

  DataLoader b(indexed(20), {.batch_size = 3, .seed = 11});
  b.seek(pos);
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(ids(b.next()), rest[i]) << "batch " << i;
  EXPECT_THROW(b.seek({0, 6}), InvalidArgument);
}

TEST(DataLoader, NoShuffleKeepsOrderAndKeepsTheLastPartialBatch) {
  DataLoader loader(indexed(7), {.batch_size = 3, .shuffle = false, .drop_last = false});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(ids(loader.next()), (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(ids(loader.next()), (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(ids(loader.next()), (std::vector<std::int32_t>{6}));
  EXPECT_EQ(ids(loader.next()), (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(DataLoader, ShardsPartitionEachGlobalBatch) {
  DataLoader whole(indexed(16), {.batch_size = 8, .seed = 5});
  DataLoader s0(indexed(16), {.batch_size = 8, .seed = 5, .num_shards = 2, .shard_index = 0});
  DataLoader s1(indexed(16), {.batch_size = 8, .seed = 5, .num_shards = 2, .shard_index = 1});
  for (int i = 0; i < 3; ++i) {
    auto all = ids(whole.next());
    auto a = ids(s0.next()), b = ids(s1.next());
    ASSERT_EQ(a.size(), 4u);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, all);
  }
  EXPECT_THROW(DataLoader(indexed(16), {.batch_size = 6, .num_shards = 4}), InvalidArgument);
  EXPECT_THROW(DataLoader(indexed(16), {.batch_size = 8, .num_shards = 2, .shard_index = 2}),
               InvalidArgument);
  EXPECT_THROW(DataLoader(indexed(3), {.batch_size = 4}), InvalidArgument);
}

TEST(Synthetic, ClassificationIsDeterministicAndBalancedEnough) {
  ArrayDataset a = synthetic_classification(300, 10, 3, Key::from_seed(4));
  ArrayDataset b = synthetic_classification(300, 10, 3, Key::from_seed(4));
  EXPECT_EQ(a.inputs.to_vector<float>(), b.inputs.to_vector<float>());
  EXPECT_EQ(a.labels.to_vector<std::int32_t>(), b.labels.to_vector<std::int32_t>());
  std::vector<int> counts(3, 0);
  for (auto y : a.labels.to_vector<std::int32_t>())
    counts.at(y)++;
  for (int c : counts)
    EXPECT_GT(c, 30);
}

TEST(Synthetic, TokensFollowAFixedPermutation) {
  ArrayDataset d = synthetic_tokens(20, 6, 11, Key::from_seed(2));
  auto x = d.inputs.to_vector<std::int32_t>();
  auto y = d.labels.to_vector<std::int32_t>();
  std::map<std::int32_t, std::int32_t> next;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_GE(x[i], 0);
    ASSERT_LT(x[i], 11);
    auto [it, inserted] = next.emplace(x[i], y[i]);
    EXPECT_EQ(it->second, y[i]);  // the same token is always followed by the same one
    if (i % 6 != 5) {
      EXPECT_EQ(x[i + 1], y[i]);
    }
  }
}

}  // namespace
}  // namespace distjax::data
