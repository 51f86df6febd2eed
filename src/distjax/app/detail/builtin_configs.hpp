// The files of configs/, built into the library (the build generates their definition
// from the files, cmake/builtin_configs.cpp.in): the example binaries start from them.
#pragma once

#include <vector>

namespace distjax::app::detail {

struct BuiltinConfig {
  const char* name;  ///< the file's name without .toml
  const char* toml;  ///< its text
};

const std::vector<BuiltinConfig>& builtin_config_files();

}  // namespace distjax::app::detail
