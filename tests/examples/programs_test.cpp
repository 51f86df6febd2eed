// The example binaries and `distjax train configs/<example>.toml` run the same config: the
// defaults each example starts from equal its file under configs/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"
#include "programs/programs.hpp"

using namespace distjax;

namespace {

std::string file_config(const std::string& name) {
  return config::to_toml(
      config::load_config(std::string(DISTJAX_SOURCE_DIR) + "/configs/" + name + ".toml"));
}

}  // namespace

TEST(Programs, ConfigsEqualTheExamplesDefaults) {
  for (const char* name : {"train_mnist", "data_parallelism", "tensor_parallelism", "train_gpt"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(file_config(name), config::to_toml(examples::program_defaults(name)));
  }
  // The examples that share a program change what their flags' defaults say.
  config::TrainConfig async = examples::program_defaults("tensor_parallelism");
  async.run.out_dir = "runs/tensor_parallelism_async";
  async.parallelism.tp_layout = "async";
  EXPECT_EQ(file_config("tensor_parallelism_async"), config::to_toml(async));
  config::TrainConfig tp_gpt = examples::program_defaults("gpt");
  tp_gpt.run.out_dir = "runs/tensor_parallel_gpt";
  EXPECT_EQ(file_config("tensor_parallel_gpt"), config::to_toml(tp_gpt));
  config::TrainConfig fsdp = examples::program_defaults("gpt");
  fsdp.run.out_dir = "runs/fsdp";
  fsdp.parallelism.fsdp.modules = {"*"};
  fsdp.parallelism.remat = {"Block"};
  fsdp.distributed.mesh_shape = {8, 1};
  fsdp.distributed.tensor_parallel_size = 1;
  EXPECT_EQ(file_config("fsdp"), config::to_toml(fsdp));
}

TEST(Programs, UnknownProgramSuggestsTheNearest) {
  try {
    examples::find_program("train_mnst");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"train_mnist\"?"), std::string::npos)
        << e.what();
  }
}

// prepare_program makes run.out_dir; one it cannot make or write is a ConfigError naming
// the key and the path (not a bare file-system error).
TEST(Programs, AnUnusableOutDirNamesTheKey) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "distjax_programs_test_file";
  std::ofstream(file) << "a file, not a directory\n";
  for (const std::string& out :
       {(file / "run").string(), std::string("/proc/distjax_no_such_dir"), std::string("/proc")}) {
    SCOPED_TRACE(out);
    config::TrainConfig c = examples::program_defaults("train_gpt");
    c.run.out_dir = out;
    try {
      examples::prepare_program(c);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("run.out_dir = \"" + out + "\""), std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove(file);
}
