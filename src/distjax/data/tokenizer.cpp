#include "distjax/data/tokenizer.hpp"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distjax/core/error.hpp"

namespace distjax::data {

namespace {

using nlohmann::json;

// The code points of a UTF-8 string (the JSON reader has checked it is UTF-8).
std::vector<std::uint32_t> code_points(const std::string& s) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    std::uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += static_cast<std::size_t>(n);
  }
  return out;
}

// GPT-2's bytes_to_unicode: the 256 characters a ByteLevel vocabulary writes bytes as (the
// printable Latin-1 bytes as themselves, the others as 256, 257, ...).
bool is_byte_level_char(std::uint32_t cp) {
  static const std::array<bool, 512> table = [] {
    std::array<bool, 512> t{};
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[static_cast<std::size_t>(printable ? b : next++)] = true;
    }
    return t;
  }();
  return cp < table.size() && table[cp];
}

// Whether a pre-tokenizer or decoder entry is ByteLevel, or a Sequence holding one.
bool has_byte_level(const json& j) {
  if (!j.is_object()) return false;
  if (j.value("type", "") == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders"})
    if (j.contains(list) && j[list].is_array())
      for (const json& e : j[list])
        if (has_byte_level(e)) return true;
  return false;
}

}  // namespace

TokenizerBytes TokenizerBytes::load(const std::string& path) {
  std::ifstream f(path);
  DISTJAX_CHECK(f.good(), IoError, "[TokenizerBytes] cannot read \"", path,
                "\"; make it with tools/prepare_tokens.py (bash scripts/prepare_tokens.sh)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    DISTJAX_THROW(IoError, "[TokenizerBytes] \"", path, "\" is not JSON: ", e.what());
  }
  const auto where = [&path] { return "[TokenizerBytes] \"" + path + "\" "; };
  DISTJAX_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), ConfigError,
                where(), "is not a Hugging Face tokenizer.json (no \"model\")");
  const json& model = j["model"];
  const std::string type = model.value("type", "");
  DISTJAX_CHECK(type == "BPE" && model.contains("vocab") && model["vocab"].is_object(),
                ConfigError, where(), "is not a byte-level BPE: its model is \"", type,
                "\", not \"BPE\" with a vocabulary");
  DISTJAX_CHECK(has_byte_level(j.value("pre_tokenizer", json())) ||
                    has_byte_level(j.value("decoder", json())),
                ConfigError, where(),
                "is not a byte-level BPE: neither its pre-tokenizer nor its decoder is "
                "ByteLevel, so its tokens' bytes are not known");
  TokenizerBytes t;
  t.path_ = path;
  std::map<std::int64_t, int> bytes;
  for (const auto& [content, id] : model["vocab"].items()) {
    const std::vector<std::uint32_t> cps = code_points(content);
    for (const std::uint32_t cp : cps)
      DISTJAX_CHECK(is_byte_level_char(cp), ConfigError, where(),
                    "is not a byte-level BPE: vocabulary entry \"", content, "\" (id ",
                    id.get<std::int64_t>(), ") holds U+", std::hex, cp,
                    ", which is not a ByteLevel byte");
    bytes[id.get<std::int64_t>()] = static_cast<int>(cps.size());
    t.ids_[content] = id.get<std::int64_t>();
  }
  // Added tokens last: "<|endoftext|>" may also sit in the vocabulary, but spells no text.
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      const auto id = a.at("id").get<std::int64_t>();
      bytes[id] = 0;
      t.ids_[a.at("content").get<std::string>()] = id;
    }
  DISTJAX_CHECK(!bytes.empty() && bytes.begin()->first >= 0, ConfigError, where(),
                "has no vocabulary or a negative id");
  t.bytes_.assign(static_cast<std::size_t>(bytes.rbegin()->first + 1), 0);
  for (const auto& [id, n] : bytes)
    t.bytes_[static_cast<std::size_t>(id)] = n;
  return t;
}

int TokenizerBytes::bytes(std::int64_t id) const {
  DISTJAX_CHECK(id >= 0 && id < vocab_size(), InvalidArgument, "[TokenizerBytes] token ", id,
                " is outside the ", vocab_size(), " ids of \"", path_, "\"");
  return bytes_[static_cast<std::size_t>(id)];
}

std::int64_t TokenizerBytes::bytes_of(const std::vector<std::int32_t>& ids) const {
  std::int64_t n = 0;
  for (const std::int32_t id : ids)
    n += bytes(id);
  return n;
}

std::int64_t TokenizerBytes::token_id(const std::string& content) const {
  const auto it = ids_.find(content);
  DISTJAX_CHECK(it != ids_.end(), ConfigError, "[TokenizerBytes] \"", path_,
                "\" has no token \"", content, "\"");
  return it->second;
}

}  // namespace distjax::data
