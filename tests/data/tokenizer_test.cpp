// data::TokenizerBytes: the byte length of each id of a byte-level BPE's tokenizer.json
// (written here by hand, in the layout Hugging Face `tokenizers` saves), and the files it
// refuses, each error naming the file.
#include "distjax/data/tokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "distjax/core/error.hpp"

namespace distjax::data {
namespace {

namespace fs = std::filesystem;

// A tokenizer.json at a fresh path, removed at the end.
struct JsonFile {
  fs::path path;
  explicit JsonFile(const std::string& text) {
    path = fs::temp_directory_path() /
           ("distjax_tokenizer_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            ".json");
    std::ofstream(path) << text;
  }
  ~JsonFile() { fs::remove(path); }
  std::string str() const { return path.string(); }
};

// "Ġ" (U+0120) is the byte 0x20 (space), "Ċ" (U+010A) is "\n", "Ã©" is the two bytes of "é".
std::string tokenizer_json(const std::string& pre_tokenizer = R"({"type": "ByteLevel"})",
                           const std::string& model_type = "BPE",
                           const std::string& extra_entry = "") {
  return R"({"version": "1.0",
  "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": true}],
  "normalizer": null, "pre_tokenizer": )" +
         pre_tokenizer + R"(,
  "decoder": null,
  "model": {"type": ")" +
         model_type + R"(", "vocab": {"<|endoftext|>": 0, "a": 1, "Ġ": 2, "Ċ": 3, "Ġthe": 4,
                              "Ã©": 5, "%Ċ": 6)" +
         extra_entry + R"(}, "merges": []}})";
}

TEST(TokenizerBytes, ByteLengthsOfAByteLevelBpe) {
  const JsonFile f(tokenizer_json());
  const TokenizerBytes t = TokenizerBytes::load(f.str());
  EXPECT_EQ(t.path(), f.str());
  ASSERT_EQ(t.vocab_size(), 7);
  EXPECT_EQ(t.bytes(0), 0);  // <|endoftext|>: an added token spells no text
  EXPECT_EQ(t.bytes(1), 1);
  EXPECT_EQ(t.bytes(2), 1);
  EXPECT_EQ(t.bytes(3), 1);
  EXPECT_EQ(t.bytes(4), 4);  // " the"
  EXPECT_EQ(t.bytes(5), 2);  // "é" in UTF-8
  EXPECT_EQ(t.bytes(6), 2);
  EXPECT_EQ(t.bytes_of({4, 2, 5, 0, 6}), 4 + 1 + 2 + 0 + 2);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.token_id("Ġthe"), 4);
  EXPECT_THROW(t.bytes(7), InvalidArgument);
  EXPECT_THROW(t.bytes(-1), InvalidArgument);
}

TEST(TokenizerBytes, ByteLevelInsideASequenceOrOnlyInTheDecoder) {
  const JsonFile seq(tokenizer_json(
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel"}]})"));
  EXPECT_EQ(TokenizerBytes::load(seq.str()).bytes(4), 4);
  std::string decoder_only = tokenizer_json("null");
  decoder_only.replace(decoder_only.find("\"decoder\": null"), 15,
                       R"("decoder": {"type": "ByteLevel"})");
  const JsonFile dec(decoder_only);
  EXPECT_EQ(TokenizerBytes::load(dec.str()).bytes(5), 2);
}

// The message of the error `load` throws, of type E.
template <class E>
std::string error_of(const std::string& path) {
  try {
    TokenizerBytes::load(path);
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error of the expected type loading " << path;
  return {};
}

TEST(TokenizerBytes, RefusesWhatIsNotAByteLevelBpeNamingTheFile) {
  const std::string missing = (fs::temp_directory_path() / "distjax_no_tokenizer.json").string();
  std::string e = error_of<IoError>(missing);
  EXPECT_NE(e.find("cannot read \"" + missing + "\""), std::string::npos) << e;
  EXPECT_NE(e.find("prepare_tokens"), std::string::npos) << e;

  const JsonFile garbage("{\"model\": ");
  e = error_of<IoError>(garbage.str());
  EXPECT_NE(e.find("\"" + garbage.str() + "\" is not JSON"), std::string::npos) << e;

  const JsonFile no_model(R"({"version": "1.0"})");
  e = error_of<ConfigError>(no_model.str());
  EXPECT_NE(e.find("\"" + no_model.str() + "\" is not a Hugging Face tokenizer.json"),
            std::string::npos)
      << e;

  const JsonFile wordpiece(tokenizer_json(R"({"type": "ByteLevel"})", "WordPiece"));
  e = error_of<ConfigError>(wordpiece.str());
  EXPECT_NE(e.find("\"" + wordpiece.str() + "\" is not a byte-level BPE: its model is "
                   "\"WordPiece\""),
            std::string::npos)
      << e;

  const JsonFile whitespace(tokenizer_json(R"({"type": "Whitespace"})"));
  e = error_of<ConfigError>(whitespace.str());
  EXPECT_NE(e.find("\"" + whitespace.str() + "\" is not a byte-level BPE: neither its "
                   "pre-tokenizer nor its decoder is ByteLevel"),
            std::string::npos)
      << e;

  // "é" as one character (U+00E9) is a ByteLevel byte (0xE9); "€" (U+20AC) is none.
  const JsonFile euro(tokenizer_json(R"({"type": "ByteLevel"})", "BPE", R"(, "€": 7)"));
  e = error_of<ConfigError>(euro.str());
  EXPECT_NE(e.find("vocabulary entry \"€\" (id 7) holds U+20ac"), std::string::npos) << e;

  const JsonFile no_token(tokenizer_json());
  EXPECT_THROW(TokenizerBytes::load(no_token.str()).token_id("<|im_end|>"), ConfigError);
}

}  // namespace
}  // namespace distjax::data
