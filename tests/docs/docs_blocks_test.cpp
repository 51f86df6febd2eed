// Every ```cpp block of the docs compiles as shown, and the blocks that can run do, with the
// checks the page writes next to them. The blocks the page runs are the docs' run test
// (docs_run_test: tests/docs/doc_run_gen.cpp makes one unit per page at build time, so a
// block that drifts from the API fails the build, naming the page and line); this test
// compiles the rest (syntax and types: -fsyntax-only) against the library's headers, and
// holds every block's marks to the rules. What a block assumes is said on the page, in an
// HTML comment on the line before it:
//
//   (nothing)                      statements: run, in a function of their own
//   <!-- given: spmd::DeviceContext& ctx, const models::Transformer& gpt -->
//                                  statements with these names in scope: run as
//                                  `void block(<given>)` by the `run:` note after the block,
//                                  or compiled only, with the reason in a `compile only:` note
//   <!-- at namespace scope -->    declarations (functions, types): compiled into the page's
//                                  run test, where later blocks' notes reach them
//   <!-- fragment: <why> -->       deliberately not compilable (part of a line, a pattern)
//   <!-- my_program.cpp -->        a whole file (also any block with #include and main())
//
// and in comments after it, hidden from the reader (several lines allowed):
//
//   <!-- check: EXPECT_EQ(v, 54.f); -->     run after the block, in its scope
//   <!-- run: ... block(ctx, x); ... -->     the test's body, giving the names (the helpers
//                                            of tests/docs/doc_run.hpp at hand)
//   <!-- compile only: <why> -->             a block given names that is not run
//
// A statement of a run block that ends in `// throws E` is expected to throw E; its message
// is `thrown` in the check. Every block is in scope of `#include "distjax/distjax.hpp"` and
// `using namespace distjax;`.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "docs/doc_blocks.hpp"

namespace {

namespace fs = std::filesystem;
using namespace distjax::docs;

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
  int run = 0, in_unit = 0, whole = 0, fragments = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const std::string at = rel + ":" + std::to_string(b.line);
    const bool statements = b.marker.empty() || starts_with(b.marker, "given:");
    EXPECT_TRUE(statements || at_namespace_scope(b) || fragment(b) || whole_file(b))
        << at << ": unknown marker <!-- " << b.marker << " -->";
    EXPECT_FALSE((b.has_check || b.has_run) && !statements && !at_namespace_scope(b))
        << at << ": only statements run; a fragment or a whole file has no check: or run:";
    EXPECT_FALSE(b.has_check && at_namespace_scope(b))
        << at << ": declarations have no check: (a run: calls them)";
    if (starts_with(b.marker, "given:")) {
      EXPECT_NE(b.has_run, b.has_compile_only)
          << at << ": a block given names is run (<!-- run: ... -->) or says why not "
          << "(<!-- compile only: ... -->)";
      EXPECT_TRUE(!b.has_compile_only || trim(b.compile_only.text).size() > 3)
          << at << ": <!-- compile only: --> says why";
      EXPECT_FALSE(b.has_check && b.has_compile_only)
          << at << ": the check: of a block that is compiled only would never run";
    } else {
      EXPECT_FALSE(b.has_compile_only) << at << ": only a block given names is compiled only";
    }
    if (runs(b) || at_namespace_scope(b)) {
      ++run;  // built and run by docs_run_test
      continue;
    }
    if (fragment(b)) {
      const std::string why = trim(b.marker.substr(std::string("fragment").size()));
      EXPECT_TRUE(starts_with(why, ":") && trim(why.substr(1)).size() > 3)
          << at << ": a fragment says why it is one (<!-- fragment: ... -->)";
      ++fragments;
      continue;
    }
    const std::string line = "#line " + std::to_string(b.line) + " \"" + rel + "\"\n";
    if (whole_file(b)) {
      const Compiled c = compile(line + b.code, "whole_" + std::to_string(i));
      EXPECT_EQ(c.status, 0) << at << " (a whole file) does not compile:\n" << c.output;
      ++whole;
      continue;
    }
    if (!statements) continue;
    const std::string ns = "docs_block_" + std::to_string(i);
    const auto [its_includes, code] = split_includes(b.code);
    includes += its_includes;
    // The block's names may shadow what it is given (its own declarations win).
    unit += "namespace " + ns + " {\n[[maybe_unused]] void block(" + given(b) + ") {\n{\n" + line +
            code + "}\n}\n}\n";
    ++in_unit;
  }
  if (in_unit > 0) {
    const Compiled c = compile(kPrelude + includes + unit, "page");
    EXPECT_EQ(c.status, 0) << rel << ": blocks that do not compile as shown:\n" << c.output;
  }
  std::printf("%s: %zu blocks: %d run (docs_run_test), %d compiled only, %d whole files, "
              "%d fragments\n",
              rel.c_str(), blocks.size(), run, in_unit, whole, fragments);
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
