// The ```cpp blocks of a docs page and the HTML comments around them, as the docs tests read
// them (docs_blocks_test compiles the blocks that are not run; doc_run_gen makes the others
// tests). Written once here, so the two read a page alike; the markers are described in
// docs/README.md and in docs_blocks_test.cpp.
#pragma once

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace distjax::docs {

/// A comment after a block's closing fence (`<!-- check: ... -->`, `<!-- run: ... -->`,
/// `<!-- compile only: ... -->`): its text without the keyword, lines kept.
struct Note {
  int line = 0;      // of the comment's first line in the page
  std::string text;  // from just after the keyword to just before "-->"
};

struct Block {
  int line = 0;        // of the first line of code in the page
  std::string marker;  // the one-line comment before the fence, without <!-- -->, trimmed
  std::string code;
  Note check;         // statements run after the block, in its scope
  Note run;           // the test's body, which calls block(...) with the given names
  Note compile_only;  // why a block that is given names is not run
  bool has_check = false, has_run = false, has_compile_only = false;
};

inline bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

inline std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

/// The blocks of `page`, with the marker before each and the notes after it.
inline std::vector<Block> cpp_blocks(const std::filesystem::path& page) {
  std::ifstream in(page);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  std::vector<Block> out;
  std::string last_nonblank;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (trim(lines[i]) != "```cpp") {
      if (!trim(lines[i]).empty()) last_nonblank = lines[i];
      continue;
    }
    Block b;
    b.line = static_cast<int>(i) + 2;
    const std::string prev = trim(last_nonblank);
    if (starts_with(prev, "<!--") && prev.size() >= 7 && prev.substr(prev.size() - 3) == "-->")
      b.marker = trim(prev.substr(4, prev.size() - 7));
    for (++i; i < lines.size() && trim(lines[i]) != "```"; ++i)
      b.code += lines[i] + "\n";
    // The notes: comments after the fence, blank lines between allowed.
    std::size_t j = i + 1;
    while (true) {
      while (j < lines.size() && trim(lines[j]).empty())
        ++j;
      if (j >= lines.size() || !starts_with(trim(lines[j]), "<!--")) break;
      std::string text = trim(lines[j]).substr(4);
      const std::pair<const char*, std::pair<Note*, bool*>> keys[] = {
          {"check:", {&b.check, &b.has_check}},
          {"run:", {&b.run, &b.has_run}},
          {"compile only:", {&b.compile_only, &b.has_compile_only}}};
      Note* note = nullptr;
      bool* has = nullptr;
      for (const auto& [key, where] : keys) {
        const std::string t = trim(text);
        if (starts_with(t, key)) {
          note = where.first;
          has = where.second;
          // Spaces for the comment's opening and the keyword keep the text's columns.
          text = std::string(text.size() - t.size() + std::string(key).size(), ' ') +
                 t.substr(std::string(key).size());
          break;
        }
      }
      if (note == nullptr) break;  // another page comment (the next block's marker, ...)
      note->line = static_cast<int>(j) + 1;
      while (text.find("-->") == std::string::npos && j + 1 < lines.size())
        text += "\n" + lines[++j];
      note->text = text.substr(0, text.find("-->")) + "\n";
      *has = true;
      ++j;
    }
    last_nonblank = "```";
    out.push_back(b);
  }
  return out;
}

/// A whole file: marked with its name (`<!-- my_program.cpp -->`) or holding main().
inline bool whole_file(const Block& b) {
  static const std::regex main_fn(R"(\bint\s+main\s*\()");
  return std::regex_search(b.code, main_fn) ||
         (b.marker.size() > 4 && b.marker.substr(b.marker.size() - 4) == ".cpp");
}

inline bool fragment(const Block& b) {
  return starts_with(b.marker, "fragment");
}

inline bool at_namespace_scope(const Block& b) {
  return b.marker == "at namespace scope";
}

/// What a block of statements is given ("" for none): the marker's list after "given:".
inline std::string given(const Block& b) {
  return starts_with(b.marker, "given:") ? trim(b.marker.substr(6)) : "";
}

/// Statements run by the docs' run test: blocks with no marker, and blocks given names that
/// a `run:` note supplies. The rest (given names without `run:`, whole files, fragments) are
/// compiled, or not, by docs_blocks_test only.
inline bool runs(const Block& b) {
  return !whole_file(b) && (b.marker.empty() || (starts_with(b.marker, "given:") && b.has_run));
}

/// A block's #include lines (hoisted to the top of the unit) and the rest, with blank lines
/// where the includes were (the lines keep their numbers).
inline std::pair<std::string, std::string> split_includes(const std::string& code) {
  std::istringstream in(code);
  std::string line, includes, rest;
  while (std::getline(in, line)) {
    if (starts_with(trim(line), "#include")) {
      includes += line + "\n";
      rest += "\n";
    } else {
      rest += line + "\n";
    }
  }
  return {includes, rest};
}

}  // namespace distjax::docs
