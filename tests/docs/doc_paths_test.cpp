// Every file path the documentation names exists: README.md, docs/*.md and the comments of
// include/ name headers, sources, configs, scripts and pages (`parallel/zero.hpp`,
// `docs/plan.md`, `configs/gpt_3d.toml`); a renamed or deleted file must take its mentions
// with it. A path is looked up from the repository root, include/distjax/, src/distjax/,
// docs/, tests/ and the naming file's own folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = DISTJAX_SOURCE_DIR;

std::vector<fs::path> documents() {
  std::vector<fs::path> out = {kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") out.push_back(e.path());
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "include"))
    if (e.path().extension() == ".hpp") out.push_back(e.path());
  return out;
}

bool exists_from(const std::string& path, const fs::path& naming_file) {
  for (const fs::path& base :
       {kRoot, kRoot / "include" / "distjax", kRoot / "src" / "distjax", kRoot / "docs",
        kRoot / "tests", kRoot / "include", naming_file.parent_path()})
    if (fs::exists(base / path)) return true;
  return false;
}

}  // namespace

TEST(DocPaths, EveryPathADocumentNamesExists) {
  // A relative path with a folder and a file of the project's kinds. Absolute paths
  // (/usr/share/...), URLs and placeholders (<part>/<name>.hpp) do not match: the character
  // before the path must not continue it.
  const std::regex path_re(
      R"((^|[^A-Za-z0-9_./<>:-])([A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)+\.(hpp|cpp|cu|md|toml|sh|py|txt|cmake)))");
  std::vector<std::string> missing;
  int checked = 0;
  for (const fs::path& doc : documents()) {
    std::ifstream f(doc);
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      for (auto it = std::sregex_iterator(line.begin(), line.end(), path_re);
           it != std::sregex_iterator(); ++it) {
        const std::string path = (*it)[2].str();
        ++checked;
        if (!exists_from(path, doc))
          missing.push_back(fs::relative(doc, kRoot).string() + ":" + std::to_string(n) + ": " +
                            path);
      }
    }
  }
  std::string all;
  for (const std::string& m : missing)
    all += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << missing.size() << " of " << checked
                               << " paths named in the docs do not exist:" << all;
  EXPECT_GT(checked, 100);  // the pattern still finds the docs' paths
}
