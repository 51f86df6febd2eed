// The GPT's text from several token sources mixed by weight (data.sources, data.weights):
// every global batch holds each source's rows in proportion, the same on any number of
// data replicas, in either order; bad mixes are refused naming the keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "distjax/app/networks.hpp"
#include "distjax/core/error.hpp"
#include "distjax/data/mix.hpp"

namespace fs = std::filesystem;
using namespace distjax;

TEST(MixRows, SplitsTheBatchByWeightWithTheLargestRemainders) {
  EXPECT_EQ(data::mix_rows({3, 1}, 16), (std::vector<std::int64_t>{12, 4}));
  EXPECT_EQ(data::mix_rows({1, 1, 1}, 8), (std::vector<std::int64_t>{3, 3, 2}));
  EXPECT_EQ(data::mix_rows({7, 3}, 8), (std::vector<std::int64_t>{6, 2}));  // 5.6, 2.4
  EXPECT_EQ(data::mix_rows({5}, 8), (std::vector<std::int64_t>{8}));
  EXPECT_THROW(data::mix_rows({1, 0}, 8), InvalidArgument);
  EXPECT_THROW(data::mix_rows({100, 1}, 8), InvalidArgument);  // the second gets no row
}

namespace {

// Source s of the test: token i is 100000 s + i, so a token says its source and position.
// Each test its own directory: ctest runs a binary's tests as processes side by side.
fs::path write_sources(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("distjax_text_data_test_" + name);
  fs::remove_all(dir);
  for (int s = 0; s < 2; ++s) {
    fs::create_directories(dir / ("s" + std::to_string(s)));
    std::vector<std::int64_t> tokens(20000 + 7000 * s);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = 100000 * s + static_cast<std::int64_t>(i);
    data::write_llmc_shard((dir / ("s" + std::to_string(s)) / "train_0.bin").string(), tokens);
  }
  data::write_llmc_shard((dir / "val.bin").string(), std::vector<std::int64_t>(500, 3));
  return dir;
}

config::TrainConfig mix_config(const fs::path& dir, const std::string& order) {
  config::TrainConfig c;
  c.run.batch_size = 8;
  c.run.eval_batches = 1;
  c.model.vocab = 200000;
  c.data.format = "tokens";
  c.data.seq_len = 16;
  c.data.order = order;
  c.data.sources = {(dir / "s0" / "*.bin").string(), (dir / "s1" / "*.bin").string()};
  c.data.weights = {3, 1};
  c.data.val = (dir / "val.bin").string();
  return c;
}

// The source of each row of a batch (all of a row's tokens must agree).
std::vector<int> row_sources(const train::Batch& b) {
  const std::vector<std::int32_t> x = b.inputs.to_vector<std::int32_t>();
  const std::int64_t t = b.inputs.shape()[1];
  std::vector<int> out;
  for (std::int64_t r = 0; r < b.size(); ++r) {
    std::set<int> of_row;
    for (std::int64_t i = 0; i < t; ++i)
      of_row.insert(x[static_cast<std::size_t>(r * t + i)] / 100000);
    EXPECT_EQ(of_row.size(), 1u);
    out.push_back(*of_row.begin());
  }
  return out;
}

}  // namespace

TEST(TextDataMix, EveryGlobalBatchHoldsEachSourcesRowsOnAnyNumberOfReplicas) {
  const fs::path dir = write_sources("rows");
  const Key key = Key::from_seed(5);
  for (const std::string order : {"random", "epochs"}) {
    const app::TextData text = app::load_text(mix_config(dir, order));
    for (std::int64_t step : {0, 1, 37}) {
      const train::Batch whole = text.batch(step, 0, 1, key);
      EXPECT_EQ(row_sources(whole), (std::vector<int>{0, 0, 0, 0, 0, 0, 1, 1})) << order;
      // 2 and 4 replicas read the same global batch, each its own rows.
      for (int replicas : {2, 4}) {
        std::vector<std::int32_t> joined;
        for (int r = 0; r < replicas; ++r) {
          const std::vector<std::int32_t> mine =
              text.batch(step, r, replicas, key).labels.to_vector<std::int32_t>();
          joined.insert(joined.end(), mine.begin(), mine.end());
        }
        EXPECT_EQ(joined, whole.labels.to_vector<std::int32_t>()) << order << " " << replicas;
      }
    }
    EXPECT_NE(text.batch(0, 0, 1, key).inputs.to_vector<std::int32_t>(),
              text.batch(1, 0, 1, key).inputs.to_vector<std::int32_t>());
  }
  fs::remove_all(dir);
}

TEST(TextDataMix, EpochsReadEachSourcesWindowsOncePerItsEpoch) {
  const fs::path dir = write_sources("epochs");
  const app::TextData text = app::load_text(mix_config(dir, "epochs"));
  // Source 1: (27000 - 1) / 16 = 1687 windows, 2 rows a step: 843 steps an epoch, which
  // read 1686 of its windows, each once (the first token says where a window starts).
  std::set<std::int32_t> starts;
  for (std::int64_t step = 0; step < 843; ++step) {
    const std::vector<std::int32_t> x =
        text.batch(step, 0, 1, Key()).inputs.to_vector<std::int32_t>();
    for (int r = 6; r < 8; ++r) {
      EXPECT_EQ(x[static_cast<std::size_t>(r * 16)] % 16, 0);
      starts.insert(x[static_cast<std::size_t>(r * 16)] - 100000);
    }
  }
  EXPECT_EQ(starts.size(), 1686u);
  for (const std::string& line : text.describe()) std::printf("%s\n", line.c_str());
  fs::remove_all(dir);
}

TEST(TextDataMix, BadMixesAreRefusedNamingTheKeys) {
  const fs::path dir = write_sources("bad");
  auto refused = [](const config::TrainConfig& c, const std::string& says) {
    try {
      (void)app::load_text(c);
      ADD_FAILURE() << "accepted; expected an error saying " << says;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  config::TrainConfig c = mix_config(dir, "random");
  c.data.weights = {1, 2, 3};
  refused(c, "data.weights has 3 weights for 2 data.sources");
  c.data.weights = {100, 1};
  refused(c, "data.weights");
  c = mix_config(dir, "random");
  c.data.train = (dir / "s0" / "*.bin").string();
  refused(c, "data.train and data.sources");
  c = mix_config(dir, "random");
  c.data.sources[1] = (dir / "none_*.bin").string();
  refused(c, "data.sources[1]");
  c = mix_config(dir, "random");
  c.model.vocab = 100000;  // source 1 holds ids up to 126999
  refused(c, "data.sources[1] holds token 126999");
  c = mix_config(dir, "random");
  c.data.format = "bytes";
  refused(c, "data.sources mixes token shards");
  fs::remove_all(dir);
}
