// The NCCL backend's host side, on any machine: how its processes find each other (the
// bootstrap plan from the launch environment, the file store), the members of a split,
// the name "nccl", and the refusal of a launch in a build without NCCL or on a machine
// without a GPU, saying why. The GPU side is tests/gpu/nccl_communicator_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distjax/comm/detail/nccl_bootstrap.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/comm/nccl/nccl_api.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"

namespace {

using namespace distjax;
using namespace distjax::comm;
namespace cd = distjax::comm::detail;
using cd::NcclBootstrap;

LaunchEnvironment env_of(const std::map<std::string, std::string>& vars) {
  return discover_launch_environment([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(NcclBootstrap, PlanFollowsTheLauncher) {
  // No launcher: one process, its own id, whatever MPI or a store offer.
  auto p = cd::plan_nccl_bootstrap(env_of({}), true, "/shared");
  EXPECT_EQ(p.how, NcclBootstrap::Single);
  EXPECT_EQ(p.world_size, 1);
  // mpirun with MPI built in: the id goes over MPI, even with a store named.
  const std::map<std::string, std::string> ompi = {{"OMPI_COMM_WORLD_RANK", "2"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  p = cd::plan_nccl_bootstrap(env_of(ompi), true, "/shared");
  EXPECT_EQ(p.how, NcclBootstrap::Mpi);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_rank, 1);
  // The same without MPI: the store, or a ConfigError that says what to set.
  p = cd::plan_nccl_bootstrap(env_of(ompi), false, "/shared");
  EXPECT_EQ(p.how, NcclBootstrap::FileStore);
  EXPECT_EQ(p.store, "/shared");
  try {
    (void)cd::plan_nccl_bootstrap(env_of(ompi), false, nullptr);
    ADD_FAILURE() << "no way to share the id was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("DISTJAX_NCCL_STORE"), std::string::npos) << what;
    EXPECT_NE(what.find("this build has no MPI"), std::string::npos) << what;
  }
  // torchrun style: the store, whether MPI is built or not; an empty value is unset.
  const std::map<std::string, std::string> torch = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  p = cd::plan_nccl_bootstrap(env_of(torch), true, "/s");
  EXPECT_EQ(p.how, NcclBootstrap::FileStore);
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_THROW((void)cd::plan_nccl_bootstrap(env_of(torch), true, ""), ConfigError);
  // RANK=0 WORLD_SIZE=1 is one process alone.
  p = cd::plan_nccl_bootstrap(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), false, nullptr);
  EXPECT_EQ(p.how, NcclBootstrap::Single);
  EXPECT_STREQ(cd::nccl_bootstrap_name(NcclBootstrap::FileStore), "file store");
}

class NcclStore : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("distjax_nccl_store_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(NcclStore, ReaderWaitsForTheWriterAndGetsEveryByte) {
  const std::string path = cd::nccl_store_path(dir_.string(), 4);
  EXPECT_EQ(std::filesystem::path(path).filename(), "nccl-unique-id-4");
  std::vector<char> id(128);
  for (std::size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<char>(i * 7 + 1);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cd::store_put(path, id.data(), id.size());
  });
  const std::vector<char> got = cd::store_get(path, id.size(), std::chrono::seconds(10));
  writer.join();
  EXPECT_EQ(got, id);
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_))
    ++files;
  EXPECT_EQ(files, 1);
}

TEST_F(NcclStore, AnIdLeftByAnEarlierRunIsRefused) {
  const std::string path = cd::nccl_store_path(dir_.string(), 2);
  const char id[4] = {1, 2, 3, 4};
  cd::store_put(path, id, sizeof(id));
  try {
    cd::store_put(path, id, sizeof(id));
    ADD_FAILURE() << "an existing id was overwritten";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("fresh directory"), std::string::npos) << e.what();
  }
}

TEST_F(NcclStore, ReaderTimesOutNamingThePathAndWhatItFound) {
  const std::string path = cd::nccl_store_path(dir_.string(), 2);
  try {
    (void)cd::store_get(path, 128, std::chrono::milliseconds(30));
    ADD_FAILURE() << "a missing id was returned";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("no such file"), std::string::npos) << what;
  }
  std::ofstream(path, std::ios::binary) << "short";
  try {
    (void)cd::store_get(path, 128, std::chrono::milliseconds(30));
    ADD_FAILURE() << "a short id was returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 bytes, not 128"), std::string::npos) << e.what();
  }
}

TEST(NcclSplit, MembersByColorThenKeyThenRank) {
  // (color, key, world rank) of ranks 0..4 of a group whose world ranks are 10..14.
  const std::vector<std::int64_t> all = {1, 5, 10, 0, 0, 11, 1, 5, 12, 1, 2, 13, 0, 0, 14};
  auto s = cd::split_members(all, 0);
  EXPECT_EQ(s.members, (std::vector<int>{13, 10, 12}));  // key 2 first, then ties by rank
  EXPECT_EQ(s.rank, 1);
  s = cd::split_members(all, 2);
  EXPECT_EQ(s.rank, 2);
  s = cd::split_members(all, 4);
  EXPECT_EQ(s.members, (std::vector<int>{11, 14}));
  EXPECT_EQ(s.rank, 1);
  EXPECT_THROW((void)cd::split_members({1, 2}, 0), InvalidArgument);
}

TEST(NcclLaunch, NameAndAvailability) {
  EXPECT_STREQ(backend_name(Backend::Nccl), "nccl");
  EXPECT_EQ(backend_available(Backend::Nccl), cd::built_with_nccl());
}

// Where the backend cannot run (no NCCL built in, or no GPU), launch refuses before it
// runs anything and says why; where it can, the GPU tests cover it.
TEST(NcclLaunch, RefusesWithTheReasonWhereItCannotRun) {
  if (cd::built_with_nccl() && tensor::cuda_device_count() > 0)
    GTEST_SKIP() << "NCCL and a GPU are here: tests/gpu/nccl_communicator_test.cpp runs it";
  LaunchOptions o;
  o.backend = Backend::Nccl;
  bool ran = false;
  try {
    launch(o, [&](Communicator&) { ran = true; });
    ADD_FAILURE() << "launch did not refuse";
  } catch (const NotImplemented& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[launch] backend nccl"), std::string::npos) << what;
    if (!cd::built_with_nccl())
      EXPECT_NE(what.find("this build has no NCCL"), std::string::npos) << what;
    else
      EXPECT_NE(what.find(tensor::cuda_unavailable_reason()), std::string::npos) << what;
  }
  EXPECT_FALSE(ran);
}

// Sets environment variables for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const std::map<std::string, std::string>& vars, const std::vector<std::string>& unset) {
    for (const auto& [k, v] : vars)
      save(k), ::setenv(k.c_str(), v.c_str(), 1);
    for (const std::string& k : unset)
      save(k), ::unsetenv(k.c_str());
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_)
      v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }

 private:
  void save(const std::string& k) {
    const char* v = std::getenv(k.c_str());
    saved_.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A launch's own mistakes are reported before the machine is asked for a GPU, so they
// show on every machine: two processes with no way to share the id, a world size that
// contradicts num_devices.
TEST(NcclLaunch, LaunchMistakesAreReportedBeforeTheGpu) {
  if (!cd::built_with_nccl()) GTEST_SKIP() << "this build has no NCCL: launch refuses first";
  const ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}},
                      {"DISTJAX_NCCL_STORE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"});
  LaunchOptions o;
  o.backend = Backend::Nccl;
  try {
    launch(o, [](Communicator&) {});
    ADD_FAILURE() << "two processes without a store were launched";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DISTJAX_NCCL_STORE"), std::string::npos) << e.what();
  }
  const ScopedEnv store({{"DISTJAX_NCCL_STORE", "/nonexistent"}}, {});
  o.num_devices = 4;
  try {
    launch(o, [](Communicator&) {});
    ADD_FAILURE() << "num_devices = 4 in a world of 2 was launched";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_devices=4"), std::string::npos) << e.what();
  }
}

}  // namespace
