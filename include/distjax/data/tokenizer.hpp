// What the GPT's evaluation needs of a byte-level BPE tokenizer (a Hugging Face
// tokenizer.json, as tools/prepare_tokens.py writes it): how many bytes of text each token
// id stands for, so that bits per token convert to bits per byte.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace distjax::data {

/// The byte length of every token id of a byte-level BPE. A ByteLevel vocabulary writes each
/// byte as one character (GPT-2's bytes_to_unicode), so an entry of n characters stands for
/// n bytes; added tokens (<|endoftext|> and other specials) stand for none.
///
///   const TokenizerBytes tok = TokenizerBytes::load("data/fortunes_bpe/tokenizer.json");
///   std::int64_t bytes = tok.bytes_of(labels);        // the text the labels spell
///   std::int64_t eot = tok.token_id("<|endoftext|>");
class TokenizerBytes {
 public:
  /// Reads `path`. IoError naming the file when it cannot be read or is not JSON;
  /// ConfigError naming it when it is not a byte-level BPE (its model is not "BPE", neither
  /// its pre-tokenizer nor its decoder is ByteLevel, or a vocabulary entry holds a character
  /// outside the ByteLevel alphabet).
  static TokenizerBytes load(const std::string& path);

  /// Ids 0 .. vocab_size() - 1 (the largest id + 1, added tokens included).
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(bytes_.size()); }
  /// Bytes of text token `id` stands for (0 for an added token or an id no entry names).
  /// InvalidArgument when id is outside [0, vocab_size()).
  int bytes(std::int64_t id) const;
  /// Bytes of all of `ids` together.
  std::int64_t bytes_of(const std::vector<std::int32_t>& ids) const;
  /// The id of token `content` (an added token such as "<|endoftext|>", or a vocabulary
  /// entry); ConfigError naming the file when there is none.
  std::int64_t token_id(const std::string& content) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<int> bytes_;                    // per id
  std::map<std::string, std::int64_t> ids_;   // content -> id, vocabulary and added tokens
};

}  // namespace distjax::data
