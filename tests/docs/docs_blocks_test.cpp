// Every ```cpp block of the docs compiles as shown: the test extracts the blocks of each page
// and compiles them (syntax and types: -fsyntax-only) against the library's headers, so a
// snippet that drifts from the API fails here, naming the page and line. What a block
// assumes is said on the page, in an HTML comment on the line before it:
//
//   (nothing)                      statements, run in a function of their own
//   <!-- given: spmd::DeviceContext& ctx, const models::Transformer& gpt -->
//                                  statements, with these names in scope
//   <!-- at namespace scope -->    declarations (functions, types)
//   <!-- fragment: <why> -->       deliberately not compilable (part of a line, a pattern)
//   <!-- my_program.cpp -->        a whole file (also any block with #include or main())
//
// Every block is in scope of `#include "distjax/distjax.hpp"` and `using namespace distjax;`.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Block {
  int line = 0;        // of the first line of code in the page
  std::string marker;  // the comment before the fence, without <!-- -->, trimmed
  std::string code;
};

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<Block> cpp_blocks(const fs::path& page) {
  std::ifstream in(page);
  std::vector<Block> out;
  std::string line, last_nonblank;
  int n = 0;
  Block* open = nullptr;
  while (std::getline(in, line)) {
    ++n;
    if (open != nullptr) {
      if (trim(line) == "```") {
        open = nullptr;
      } else {
        open->code += line + "\n";
      }
      continue;
    }
    if (trim(line) == "```cpp") {
      Block b;
      b.line = n + 1;
      const std::string prev = trim(last_nonblank);
      if (prev.rfind("<!--", 0) == 0 && prev.size() >= 7 && prev.substr(prev.size() - 3) == "-->")
        b.marker = trim(prev.substr(4, prev.size() - 7));
      out.push_back(b);
      open = &out.back();
    }
    if (!trim(line).empty()) last_nonblank = line;
  }
  return out;
}

bool whole_file(const Block& b) {
  static const std::regex main_fn(R"(\bint\s+main\s*\()");
  return std::regex_search(b.code, main_fn) ||
         (b.marker.size() > 4 && b.marker.substr(b.marker.size() - 4) == ".cpp");
}

// A block's #include lines (hoisted to the top of the unit) and the rest, with blank lines
// where the includes were (the lines keep their numbers).
std::pair<std::string, std::string> split_includes(const std::string& code) {
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

struct Compiled {
  int status = 0;
  std::string output;
};

// Compiles `source` (syntax and semantics, no code) with the library's include path.
Compiled compile(const std::string& source, const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("distjax_docs_blocks_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path src = dir / (name + ".cpp"), log = dir / (name + ".log");
  std::ofstream(src) << source;
  const char* cxx = std::getenv("CXX");
  const std::string command = std::string(cxx != nullptr && *cxx != '\0' ? cxx : "c++") +
                              " -std=c++20 -fsyntax-only -I" DISTJAX_SOURCE_DIR "/include " +
                              src.string() + " > " + log.string() + " 2>&1";
  Compiled c;
  c.status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  c.output = text.str();
  fs::remove_all(dir);
  return c;
}

const char* kPrelude = "#include \"distjax/distjax.hpp\"\nusing namespace distjax;\n";

std::vector<fs::path> pages() {
  std::vector<fs::path> out{fs::path(DISTJAX_SOURCE_DIR) / "README.md"};
  for (const auto& e : fs::directory_iterator(fs::path(DISTJAX_SOURCE_DIR) / "docs"))
    if (e.path().extension() == ".md" && !cpp_blocks(e.path()).empty()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class DocsBlocks : public ::testing::TestWithParam<fs::path> {};

TEST_P(DocsBlocks, CompileAsShown) {
  const fs::path page = GetParam();
  const std::string rel = fs::relative(page, DISTJAX_SOURCE_DIR).string();
  const std::vector<Block> blocks = cpp_blocks(page);
  // The blocks that are not whole files share one translation unit, each in a namespace of
  // its own; #line points the compiler's messages at the page.
  std::string includes, unit;
  int in_unit = 0, whole = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const std::string at = rel + ":" + std::to_string(b.line);
    if (starts_with(b.marker, "fragment")) {
      const std::string why = trim(b.marker.substr(std::string("fragment").size()));
      EXPECT_TRUE(starts_with(why, ":") && trim(why.substr(1)).size() > 3)
          << at << ": a fragment says why it is one (<!-- fragment: ... -->)";
      continue;
    }
    const std::string line = "#line " + std::to_string(b.line) + " \"" + rel + "\"\n";
    if (whole_file(b)) {
      const Compiled c = compile(line + b.code, "whole_" + std::to_string(i));
      EXPECT_EQ(c.status, 0) << at << " (a whole file) does not compile:\n" << c.output;
      ++whole;
      continue;
    }
    const std::string ns = "docs_block_" + std::to_string(i);
    const auto [its_includes, code] = split_includes(b.code);
    includes += its_includes;
    if (b.marker == "at namespace scope") {
      unit += "namespace " + ns + " {\n" + line + code + "}\n";
    } else {
      std::string given;
      if (starts_with(b.marker, "given:")) {
        given = trim(b.marker.substr(6));
      } else {
        EXPECT_TRUE(b.marker.empty()) << at << ": unknown marker <!-- " << b.marker << " -->";
      }
      // The block's names may shadow what it is given (its own declarations win).
      unit += "namespace " + ns + " {\n[[maybe_unused]] void block(" + given + ") {\n{\n" + line +
              code + "}\n}\n}\n";
    }
    ++in_unit;
  }
  if (in_unit > 0) {
    const Compiled c = compile(kPrelude + includes + unit, "page");
    EXPECT_EQ(c.status, 0) << rel << ": blocks that do not compile as shown:\n" << c.output;
  }
  std::printf("%s: %zu blocks, %d compiled in one unit, %d whole files\n", rel.c_str(),
              blocks.size(), in_unit, whole);
}

INSTANTIATE_TEST_SUITE_P(
    Pages, DocsBlocks, ::testing::ValuesIn(pages()),
    [](const ::testing::TestParamInfo<fs::path>& info) {
      std::string name = fs::relative(info.param, DISTJAX_SOURCE_DIR).replace_extension().string();
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

}  // namespace
