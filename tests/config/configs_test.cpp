// Every file under configs/ parses, resolves (no launcher) and validates.
#include <gtest/gtest.h>

#include <filesystem>
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
