// The program docs/app.md shows as "a program of your own" is examples/my_program.cpp, the
// file the build compiles and the tests run (ctest example_my_program), and it stays short.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(DocsApp, TheOwnProgramIsTheExampleFile) {
  const std::string doc = read(std::filesystem::path(DISTJAX_SOURCE_DIR) / "docs" / "app.md");
  const std::string file =
      read(std::filesystem::path(DISTJAX_SOURCE_DIR) / "examples" / "my_program.cpp");
  const std::string marker = "<!-- my_program.cpp -->\n```cpp\n";
  const auto at = doc.find(marker);
  ASSERT_NE(at, std::string::npos) << "docs/app.md lost its marker " << marker;
  const auto begin = at + marker.size();
  const auto end = doc.find("```\n", begin);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(doc.substr(begin, end - begin), file)
      << "docs/app.md shows another program than examples/my_program.cpp";
  EXPECT_LT(std::count(file.begin(), file.end(), '\n'), 40) << "the program grew past 40 lines";
}
