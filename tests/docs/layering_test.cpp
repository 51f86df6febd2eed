// The library's parts keep the order docs/architecture.md states: a file of part P
// (include/distjax/P/, src/distjax/P/) includes only headers of P and of the parts before it
// in the line "Order: core, tensor, ...". So no two parts depend on each other, and a
// part added without a place in that line is an error too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = DISTJAX_SOURCE_DIR;

// The parts in the order architecture.md's "Order:" line gives them.
std::vector<std::string> documented_order() {
  std::ifstream in(kRoot / "docs" / "architecture.md");
  const std::regex order_line(R"(^Order: (.+)$)");
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_match(line, m, order_line)) {
      std::vector<std::string> parts;
      std::stringstream list(m[1].str());
      for (std::string part; std::getline(list, part, ',');) {
        part.erase(0, part.find_first_not_of(" `"));
        part.erase(part.find_last_not_of(" `.") + 1);
        parts.push_back(part);
      }
      return parts;
    }
  return {};
}

int rank_of(const std::vector<std::string>& order, const std::string& part) {
  const auto it = std::find(order.begin(), order.end(), part);
  return it == order.end() ? -1 : static_cast<int>(it - order.begin());
}

}  // namespace

TEST(Layering, EveryPartIncludesOnlyThePartsBeforeIt) {
  const std::vector<std::string> order = documented_order();
  ASSERT_FALSE(order.empty()) << "docs/architecture.md has no line \"Order: core, tensor, ...\"";
  const std::regex include_line(R"re(^\s*#\s*include\s+"distjax/([a-z_0-9]+)/)re");
  std::vector<std::string> broken;
  int files = 0;
  for (const char* top : {"include", "src"})
    for (const auto& dir : fs::directory_iterator(kRoot / top / "distjax")) {
      if (!dir.is_directory()) continue;
      const std::string part = dir.path().filename().string();
      const int rank = rank_of(order, part);
      if (rank < 0) {
        broken.push_back(dir.path().string() + ": part \"" + part +
                         "\" has no place in architecture.md's Order line");
        continue;
      }
      for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
        if (!e.is_regular_file()) continue;
        ++files;
        std::ifstream in(e.path());
        std::string line;
        std::smatch m;
        for (int n = 1; std::getline(in, line); ++n) {
          if (!std::regex_search(line, m, include_line)) continue;
          const std::string used = m[1].str();
          if (rank_of(order, used) > rank)
            broken.push_back(fs::relative(e.path(), kRoot).string() + ":" + std::to_string(n) +
                             ": " + part + " includes " + used + ", a part after it");
        }
      }
    }
  EXPECT_GT(files, 100);  // the walk found the library
  std::string list;
  for (const std::string& b : broken)
    list += "\n  " + b;
  EXPECT_TRUE(broken.empty()) << broken.size() << " includes break the order of the parts:" << list;
}
