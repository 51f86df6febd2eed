// tools/prepare_tokens.py (Hugging Face `tokenizers`, from .venv-test): a small corpus written
// here becomes BPE shards that read back with data::TokenShards and decode, through this
// test's own reading of the ByteLevel alphabet, to the byte corpus's splits exactly, an
// end-of-text token after each document; a tokenizer.json read back gives the same shards;
// and configs/gpt_tokens.toml trains on BPE shards of the fortunes reporting bits per byte
// as bits per token * tokens / bytes of its validation set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distjax/data/text_corpus.hpp"
#include "distjax/data/token_shards.hpp"
#include "distjax/data/tokenizer.hpp"
#include "tools/tool_run.hpp"

namespace fs = std::filesystem;
using namespace distjax;

namespace {

const std::string kScript = std::string(DISTJAX_SOURCE_DIR) + "/tools/prepare_tokens.py";

#define PYTHON_OR_SKIP(python)                                                                 \
  const std::string python = distjax::testing::python_that_runs("import tokenizers");          \
  if (python.empty()) {                                                                        \
    if (std::getenv("DISTJAX_REQUIRE_TOKENIZERS") != nullptr)                                  \
      FAIL() << "no Python with tokenizers (DISTJAX_REQUIRE_TOKENIZERS is set): run "          \
                "scripts/setup_python.sh";                                                     \
    GTEST_SKIP() << "no Python with tokenizers: run scripts/setup_python.sh (makes .venv-test) " \
                    "or set DISTJAX_PYTHON";                                                   \
  }

// GPT-2's bytes_to_unicode inverted, written out here apart from the library's reader:
// code point -> byte.
std::map<std::uint32_t, std::uint8_t> byte_of_char() {
  std::map<std::uint32_t, std::uint8_t> m;
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[kept ? b : next++] = static_cast<std::uint8_t>(b);
  }
  return m;
}

// id -> the bytes it spells; `eot` gets the id of <|endoftext|>.
std::vector<std::string> decode_table(const fs::path& tokenizer_json, std::int64_t* eot) {
  const auto j = nlohmann::json::parse(std::ifstream(tokenizer_json));
  const auto bytes = byte_of_char();
  std::vector<std::string> table;
  for (const auto& [content, id] : j["model"]["vocab"].items()) {
    std::string out;
    for (std::size_t i = 0; i < content.size();) {  // UTF-8 code points, 1 or 2 bytes here
      const auto c = static_cast<unsigned char>(content[i]);
      std::uint32_t cp = c;
      if (c >= 0xC0) {
        cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(content[i + 1]) & 0x3Fu);
        ++i;
      }
      ++i;
      out.push_back(static_cast<char>(bytes.at(cp)));
    }
    const auto k = id.get<std::size_t>();
    if (table.size() <= k) table.resize(k + 1);
    table[k] = out;
  }
  for (const auto& a : j["added_tokens"])
    if (a["content"] == "<|endoftext|>") *eot = a["id"].get<std::int64_t>();
  return table;
}

// A small corpus: files with fortunes' "%" lines and files without, multi-byte UTF-8, and a
// split (returned: its validation fraction) that cuts a 3-byte character in two.
double write_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  std::string total;
  for (int f = 0; f < 6; ++f) {
    std::string text;
    for (int d = 0; d < 40; ++d) {
      text += "Fortune " + std::to_string(f * 40 + d) + ": the café's crème brûlée costs 3€";
      text += (d % 3 == 0 ? "\n  -- a \"quoted\" line\twith\ttabs\n" : "\n");
      if (f % 2 == 0) text += "%\n";  // even files: fortunes; odd: one document each
    }
    std::ofstream(dir / ("file_" + std::to_string(f)), std::ios::binary) << text;
    total += text;
  }
  std::ofstream(dir / "file_0.dat") << "an index the reader skips";
  // Cut inside the first "€" (E2 82 AC) past 80% of the bytes: between its first two bytes.
  const auto cut = static_cast<double>(total.find("\xE2\x82\xAC", total.size() * 4 / 5) + 1);
  const auto n = static_cast<double>(total.size());
  return (n - cut + 0.5) / n;
}

// Document ends (after a "%" line or at a file's end) in the corpus of `dir`, as positions.
std::vector<std::int64_t> document_ends(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() != ".dat") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::int64_t> ends;
  std::int64_t at = 0;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    for (std::string line; std::getline(in, line);) {
      at += static_cast<std::int64_t>(line.size()) + 1;
      if (line == "%") ends.push_back(at);
    }
    if (ends.empty() || ends.back() != at) ends.push_back(at);
  }
  return ends;
}

std::vector<std::int64_t> tokens_of(const data::TokenShards& s) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(s.size()));
  for (std::int64_t i = 0; i < s.size(); ++i)
    t[static_cast<std::size_t>(i)] = s.at(i);
  return t;
}

}  // namespace

TEST(PrepareTokens, BpeShardsSpellTheByteSplitsWithAnEndOfTextAfterEachDocument) {
  PYTHON_OR_SKIP(python);
  const fs::path root = fs::temp_directory_path() / "distjax_prepare_tokens_test";
  fs::remove_all(root);
  const double fraction = write_corpus(root / "text");
  char frac[32];
  std::snprintf(frac, sizeof frac, "%.17g", fraction);
  const std::string base = "'" + python + "' '" + kScript + "' --text " +
                           (root / "text").string() + " --validation-fraction " + frac;
  auto [status, output] = distjax::testing::run_tool(base + " --vocab 300 --shard-tokens 2000 --out " +
                                                     (root / "bpe").string());
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("bytes per token"), std::string::npos) << output;

  const data::ByteCorpus corpus =
      data::ByteCorpus::from_bytes(data::read_text_files((root / "text").string()), fraction);
  const auto cut = static_cast<std::int64_t>(corpus.train.size());
  ASSERT_EQ(static_cast<unsigned char>(corpus.validation[0]), 0x82u);  // a cut character
  const std::vector<std::int64_t> ends = document_ends(root / "text");
  ASSERT_EQ(ends.back(), cut + static_cast<std::int64_t>(corpus.validation.size()));
  std::int64_t train_docs = 0;
  for (const std::int64_t e : ends)
    train_docs += e <= cut;
  const std::int64_t val_docs = static_cast<std::int64_t>(ends.size()) - train_docs;
  train_docs += std::find(ends.begin(), ends.end(), cut) == ends.end();  // the cut one

  std::int64_t eot = -1;
  const std::vector<std::string> table = decode_table(root / "bpe" / "tokenizer.json", &eot);
  ASSERT_GE(eot, 0);
  const data::TokenizerBytes tok =
      data::TokenizerBytes::load((root / "bpe" / "tokenizer.json").string());
  EXPECT_EQ(tok.token_id("<|endoftext|>"), eot);
  EXPECT_LE(tok.vocab_size(), 300);
  struct Split {
    const char* glob;
    const std::vector<std::uint8_t>& bytes;
    std::int64_t docs;
  };
  for (const Split& s : {Split{"train_*.bin", corpus.train, train_docs},
                         Split{"val_*.bin", corpus.validation, val_docs}}) {
    SCOPED_TRACE(s.glob);
    const data::TokenShards shards = data::TokenShards::open((root / "bpe" / s.glob).string(), "x");
    if (std::string(s.glob) == "train_*.bin") {
      EXPECT_GT(shards.files().size(), 1u);
    }
    EXPECT_LT(shards.max_token(), tok.vocab_size());
    std::string text;
    std::int64_t bytes = 0, eots = 0;
    for (const std::int64_t id : tokens_of(shards)) {
      bytes += tok.bytes(id);
      if (id == eot) {
        ++eots;
        // An end of text where a document ends: after "%\n", at a file's end, at the cut.
        const std::int64_t at = static_cast<std::int64_t>(text.size()) +
                                (std::string(s.glob) == "val_*.bin" ? cut : 0);
        EXPECT_TRUE(std::find(ends.begin(), ends.end(), at) != ends.end() || at == cut) << at;
      } else {
        text += table.at(static_cast<std::size_t>(id));
      }
    }
    EXPECT_EQ(bytes, static_cast<std::int64_t>(s.bytes.size()));
    const std::string want(s.bytes.begin(), s.bytes.end());  // lossless
    const auto diff = std::mismatch(text.begin(), text.end(), want.begin(), want.end());
    EXPECT_TRUE(text == want) << "first difference at byte " << (diff.first - text.begin())
                              << " of " << want.size();
    EXPECT_EQ(eots, s.docs);
    EXPECT_EQ(shards.at(shards.size() - 1), eot);
    EXPECT_LT(shards.size() * 2, bytes);  // a BPE: well under a token a byte
  }

  // The tokenizer.json read back makes the same shards.
  std::tie(status, output) = distjax::testing::run_tool(
      base + " --shard-tokens 2000 --tokenizer " + (root / "bpe" / "tokenizer.json").string() +
      " --out " + (root / "again").string());
  ASSERT_EQ(status, 0) << output;
  for (const char* glob : {"train_*.bin", "val_*.bin"})
    EXPECT_EQ(tokens_of(data::TokenShards::open((root / "again" / glob).string(), "x")),
              tokens_of(data::TokenShards::open((root / "bpe" / glob).string(), "x")));
  std::tie(status, output) = distjax::testing::run_tool(
      base + " --tokenizer " + (root / "none.json").string() + " --out " + (root / "x").string());
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("no tokenizer file"), std::string::npos) << output;
  fs::remove_all(root);
}

TEST(PrepareTokens, GptTokensConfigReportsBitsPerByte) {
  PYTHON_OR_SKIP(python);
  const fs::path dir = fs::temp_directory_path() / "distjax_prepare_tokens_test_gpt";
  fs::remove_all(dir);
  auto [status, output] = distjax::testing::run_tool("'" + python + "' '" + kScript +
                                                     "' --vocab 512 --out " +
                                                     (dir / "bpe").string());
  ASSERT_EQ(status, 0) << output;
  std::tie(status, output) = distjax::testing::run_tool(
      std::string(DISTJAX_TOOL) + " train " + DISTJAX_SOURCE_DIR +
      "/configs/gpt_tokens.toml --set run.steps=2 --set run.eval_batches=1 "
      "--set run.checkpoint_every=0 --set run.timeline=false --set model.vocab=512 " +
      "--set data.train=" + (dir / "bpe" / "train_*.bin").string() +
      " --set data.val=" + (dir / "bpe" / "val_*.bin").string() +
      " --set data.tokenizer=" + (dir / "bpe" / "tokenizer.json").string() + " --out " +
      (dir / "out").string());
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find(" bits per byte"), std::string::npos) << output;
  const auto summary = nlohmann::json::parse(std::ifstream(dir / "out" / "summary.json"));
  ASSERT_TRUE(summary.contains("val_bits_per_byte")) << summary.dump();

  // Bits per byte = bits per token * label tokens / label bytes of the validation set
  // (one batch of 16 windows of 64, spread over the split as the GPT takes them).
  const data::TokenShards val =
      data::TokenShards::open((dir / "bpe" / "val_*.bin").string(), "data.val");
  const data::TokenizerBytes tok =
      data::TokenizerBytes::load((dir / "bpe" / "tokenizer.json").string());
  std::int64_t tokens = 0, bytes = 0;
  for (const train::Batch& b : data::spread_windows(val, 16, 64, 1))
    for (const std::int32_t id : b.labels.to_vector<std::int32_t>()) {
      ++tokens;
      bytes += tok.bytes(id);
    }
  const double per_token = summary["val_bits_per_token"].get<double>();
  const double per_byte = summary["val_bits_per_byte"].get<double>();
  EXPECT_NEAR(per_byte, per_token * static_cast<double>(tokens) / static_cast<double>(bytes),
              1e-9 * per_token);
  EXPECT_LT(per_byte, per_token / 1.5);  // 512 ids: 1.8 bytes a token on the fortunes
  fs::remove_all(dir);
}
