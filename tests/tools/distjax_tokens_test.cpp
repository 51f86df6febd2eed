// `distjax train` on token shards (data.format = "tokens"): the fortunes corpus written as
// llm.c shards of byte tokens trains the (2, 2, 2) GPT to the same losses, record for
// record, as the byte corpus itself (its batches made ahead on a host thread, the byte run's
// by the step), its metrics named per token; bad shards and a
// vocabulary below their ids are refused before any step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distjax/data/text_corpus.hpp"
#include "distjax/data/token_shards.hpp"
#include "tools/tool_run.hpp"

namespace fs = std::filesystem;
using namespace distjax;

namespace {

std::vector<nlohmann::json> records(const fs::path& out) {
  std::vector<nlohmann::json> r;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    r.push_back(nlohmann::json::parse(line));
  return r;
}

// The byte corpus's splits (data.validation_fraction's default) as shards of byte tokens:
// train in two files, so windows cross from one into the other.
// Each test its own directory: ctest runs a binary's tests as processes side by side.
fs::path write_fortune_shards(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("distjax_tokens_test_shards_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const data::ByteCorpus corpus = data::load_fortunes(data::kFortunesDir, 0.05);
  const std::size_t half = corpus.train.size() / 2;
  data::write_llmc_shard((dir / "train_000.bin").string(),
                         {corpus.train.begin(), corpus.train.begin() + half});
  data::write_llmc_shard((dir / "train_001.bin").string(),
                         {corpus.train.begin() + half, corpus.train.end()});
  data::write_llmc_shard((dir / "val_000.bin").string(),
                         {corpus.validation.begin(), corpus.validation.end()});
  return dir;
}

const std::string kGpt3d = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                           "/configs/gpt_3d.toml --set run.steps=4 --set run.log_every=1 "
                           "--set run.eval_every=4 --set run.eval_batches=2 "
                           "--set run.checkpoint_every=0 --set run.timeline=false";

}  // namespace

TEST(DistjaxTokens, FortunesAsTokenShardsTrainToTheByteCorpussLosses) {
  const fs::path shards = write_fortune_shards("bytes");
  const fs::path bytes_out = fs::temp_directory_path() / "distjax_tokens_test_bytes";
  const fs::path tokens_out = fs::temp_directory_path() / "distjax_tokens_test_tokens";
  fs::remove_all(bytes_out);
  fs::remove_all(tokens_out);
  // The byte run's steps make their own batches, the token run's are made ahead on a host
  // thread (data.prefetch): the same losses either way.
  const auto [s1, o1] = distjax::testing::run_tool(kGpt3d + " --set data.prefetch=false --out " +
                                                   bytes_out.string());
  ASSERT_EQ(s1, 0) << o1;
  const auto [s2, o2] = distjax::testing::run_tool(
      kGpt3d + " --set data.format=tokens --set data.train=" + (shards / "train_*.bin").string() +
      " --set data.val=" + (shards / "val_*.bin").string() + " --set model.vocab=256 --out " +
      tokens_out.string());
  ASSERT_EQ(s2, 0) << o2;
  EXPECT_NE(o2.find("bits per token"), std::string::npos) << o2;

  const std::vector<nlohmann::json> a = records(bytes_out), b = records(tokens_out);
  ASSERT_EQ(a.size(), b.size());
  int train = 0, eval = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]["step"], b[i]["step"]);
    if (a[i].contains("loss")) {
      ++train;
      EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << a[i]["step"];
      EXPECT_EQ(a[i]["bits_per_byte"].get<double>(), b[i]["bits_per_token"].get<double>());
    }
    if (a[i].contains("eval_loss")) {
      ++eval;
      EXPECT_EQ(a[i]["eval_loss"].get<double>(), b[i]["eval_loss"].get<double>());
      EXPECT_EQ(a[i]["eval_bits_per_byte"].get<double>(),
                b[i]["eval_bits_per_token"].get<double>());
    }
  }
  EXPECT_EQ(train, 4);
  EXPECT_GE(eval, 1);
  const auto summary = nlohmann::json::parse(std::ifstream(tokens_out / "summary.json"));
  EXPECT_TRUE(summary.contains("val_bits_per_token")) << summary.dump();
  const double wait = summary.at("data_wait_fraction").get<double>();
  EXPECT_TRUE(wait >= 0 && wait < 1) << wait;
  EXPECT_NE(o2.find("made ahead on a host thread"), std::string::npos) << o2;
  EXPECT_NE(o1.find("made by the step"), std::string::npos) << o1;
  fs::remove_all(bytes_out);
  fs::remove_all(tokens_out);
  fs::remove_all(shards);
}

TEST(DistjaxTokens, BadShardsAndASmallVocabularyAreRefusedBeforeAnyStep) {
  const fs::path dir = fs::temp_directory_path() / "distjax_tokens_test_bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  data::write_llmc_shard((dir / "train.bin").string(), {1, 2, 3, 700, 5, 6, 7, 8, 9, 10});
  data::write_llmc_shard((dir / "val.bin").string(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const std::string base = std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
                           "/configs/train_gpt.toml --set run.steps=1 --set data.seq_len=4 "
                           "--set run.batch_size=1 --set run.eval_batches=1 --set model.layers=1 "
                           "--set data.format=tokens --out " +
                           (dir / "out").string();
  const std::string shards = " --set data.train=" + (dir / "train.bin").string() +
                             " --set data.val=" + (dir / "val.bin").string();
  // A vocabulary below the shards' largest token.
  auto [status, output] = distjax::testing::run_tool(base + shards + " --set model.vocab=512");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("model.vocab = 512: data.train holds token 700"), std::string::npos)
      << output;
  EXPECT_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  // No shard where the key points.
  std::tie(status, output) = distjax::testing::run_tool(
      base + " --set data.train=" + (dir / "nothing_*.bin").string() +
      " --set data.val=" + (dir / "val.bin").string() + " --set model.vocab=1024");
  EXPECT_NE(status, 0);
  EXPECT_NE(
      output.find("data.train = \"" + (dir / "nothing_*.bin").string() + "\" matches no file"),
      std::string::npos)
      << output;
  // Tokens without their globs.
  std::tie(status, output) = distjax::testing::run_tool(base + " --set model.vocab=1024");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("data.format = \"tokens\" needs data.train and data.val"),
            std::string::npos)
      << output;
  fs::remove_all(dir);
}

// `distjax data prepare` writes the fortunes as byte shards that read back as the corpus's
// splits, and configs/gpt_tokens.toml (made for BPE shards) trains on them as its header says.
TEST(DistjaxTokens, PrepareWritesShardsTheTokensConfigTrainsOn) {
  const fs::path dir = fs::temp_directory_path() / "distjax_tokens_test_prepare";
  fs::remove_all(dir);
  auto [status, output] = distjax::testing::run_tool(std::string(DISTJAX_TOOL) +
                                                     " data prepare --shard-tokens 1000000 --out " +
                                                     (dir / "shards").string());
  ASSERT_EQ(status, 0) << output;
  const data::ByteCorpus corpus = data::load_fortunes(data::kFortunesDir, 0.05);
  const data::TokenShards train =
      data::TokenShards::open((dir / "shards" / "train_*.bin").string(), "data.train");
  const data::TokenShards val =
      data::TokenShards::open((dir / "shards" / "val_*.bin").string(), "data.val");
  ASSERT_EQ(train.size(), static_cast<std::int64_t>(corpus.train.size()));
  ASSERT_EQ(val.size(), static_cast<std::int64_t>(corpus.validation.size()));
  EXPECT_GT(train.files().size(), 1u);  // 1M tokens a shard
  for (std::int64_t i = 0; i < train.size(); i += 9973)
    ASSERT_EQ(train.at(i), corpus.train[i]);
  EXPECT_EQ(val.at(val.size() - 1), corpus.validation.back());

  std::tie(status, output) = distjax::testing::run_tool(
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/gpt_tokens.toml --set run.steps=2 --set run.eval_batches=1 "
      "--set run.checkpoint_every=0 --set run.timeline=false --set model.vocab=256 "
      "--set data.tokenizer= --set data.train=" +
      (dir / "shards" / "train_*.bin").string() + " --set data.val=" +
      (dir / "shards" / "val_*.bin").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(status, 0) << output;
  const auto summary = nlohmann::json::parse(std::ifstream(dir / "out" / "summary.json"));
  EXPECT_TRUE(summary.contains("val_bits_per_token")) << summary.dump();
  fs::remove_all(dir);
}

// configs/gpt2_124m_gpu.toml takes real token shards as its header says (here on the CPU,
// its shape cut down): packed documents, epochs, the mask on.
TEST(DistjaxTokens, TheGpt2ConfigTakesTokenShardsAsItsHeaderSays) {
  const fs::path shards = write_fortune_shards("gpt2");
  const fs::path out = fs::temp_directory_path() / "distjax_tokens_test_gpt2";
  fs::remove_all(out);
  const auto [status, output] = distjax::testing::run_tool(
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/gpt2_124m_gpu.toml --set distributed.device=cpu "
      "--set distributed.mixed_precision=no --set model.layers=1 --set model.d_model=32 "
      "--set model.heads=2 --set data.seq_len=32 --set run.batch_size=4 --set run.steps=2 "
      "--set run.eval_batches=1 --set run.eval_at_start=false --set data.format=tokens "
      "--set data.train=" + (shards / "train_*.bin").string() +
      " --set data.val=" + (shards / "val_*.bin").string() +
      " --set data.order=epochs --set data.eot=10 --set data.document_attention=true --out " +
      out.string());
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("Order: epochs of"), std::string::npos) << output;
  const auto summary = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  EXPECT_TRUE(summary.contains("val_bits_per_token")) << summary.dump();
  fs::remove_all(out);
  fs::remove_all(shards);
}
