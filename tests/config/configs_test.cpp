// Every file under configs/ parses, resolves (no launcher) and validates.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"

using namespace distjax;

TEST(Configs, EveryFileParsesAndValidates) {
  const std::filesystem::path dir = std::filesystem::path(DISTJAX_SOURCE_DIR) / "configs";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".toml") files.push_back(entry.path());
  ASSERT_GE(files.size(), 7u) << "one config per example under " << dir;
  const comm::LaunchEnvironment none =
      comm::discover_launch_environment([](const char*) -> const char* { return nullptr; });
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    config::TrainConfig c;
    ASSERT_NO_THROW(c = config::load_config(f.string())) << f;
    EXPECT_FALSE(c.run.program.empty());
    c.distributed = config::resolve(c.distributed, none);
    EXPECT_NO_THROW(c.validate(f.string()));
    EXPECT_NO_THROW(config::build_mesh(c.distributed));
  }
}

TEST(Configs, EveryKeyIsDocumented) {
  std::ifstream in(std::filesystem::path(DISTJAX_SOURCE_DIR) / "docs" / "configs.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const config::ConfigKey& k : config::config_keys()) {
    const auto dot = k.name.rfind('.');
    const std::string table = "### [" + k.name.substr(0, dot) + "]";
    const std::string row = "| `" + k.name.substr(dot + 1) + "` |";
    const auto at = doc.find(table);
    ASSERT_NE(at, std::string::npos) << table << " missing from docs/configs.md";
    EXPECT_NE(doc.find(row, at), std::string::npos) << k.name << " missing from docs/configs.md";
  }
}
