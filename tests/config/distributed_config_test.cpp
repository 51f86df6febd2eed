// DistributedConfig: every validation rule gives its message, derived values, resolution
// from each launcher's environment, and the mesh built from a config.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include "distjax/config/distributed_config.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/core/error.hpp"

using namespace distjax;
using config::BackendChoice;
using config::DistributedConfig;

namespace {

// A valid 8-device config on one node: data 4 x model 2.
DistributedConfig valid() {
  DistributedConfig c;
  c.world_size = 8;
  c.num_nodes = 1;
  c.num_processes_per_node = 8;
  c.tensor_parallel_size = 2;
  c.backend = BackendChoice::Threads;
  return c;
}

// All problems joined, for EXPECT_NE(find) checks.
std::string problems(const DistributedConfig& c) {
  std::string out;
  for (const std::string& p : c.problems())
    out += p + "\n";
  return out;
}

#define EXPECT_PROBLEM(config, text)                                                               \
  do {                                                                                             \
    const std::string all_ = problems(config);                                                     \
    EXPECT_NE(all_.find(text), std::string::npos) << "expected: " << (text) << "\ngot:\n" << all_; \
  } while (0)

comm::LaunchEnvironment env_of(const std::map<std::string, std::string>& vars) {
  return comm::discover_launch_environment([&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(DistributedConfig, ValidConfigHasNoProblemsAndDerivedValues) {
  const DistributedConfig c = valid();
  EXPECT_TRUE(c.problems().empty()) << problems(c);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.data_parallel_size(), 4);
  EXPECT_TRUE(c.is_main_process());
  EXPECT_TRUE(c.is_local_main_process());
  DistributedConfig other = valid();
  other.rank = 3;
  other.local_rank = 1;
  EXPECT_FALSE(other.is_main_process());
  EXPECT_FALSE(other.is_local_main_process());
}

TEST(DistributedConfig, SizesMustBePositive) {
  DistributedConfig c = valid();
  c.world_size = -1;
  EXPECT_PROBLEM(c, "world_size = -1 must be positive");
  c = valid();
  c.tensor_parallel_size = 0;
  EXPECT_PROBLEM(c, "tensor_parallel_size = 0 must be positive");
  c = valid();
  c.pipeline_parallel_size = 0;
  EXPECT_PROBLEM(c, "pipeline_parallel_size = 0 must be positive");
  c = valid();
  c.num_nodes = 0;
  EXPECT_PROBLEM(c, "num_nodes = 0 must be positive");
  c = valid();
  c.num_processes_per_node = -2;
  EXPECT_PROBLEM(c, "num_processes_per_node = -2 must be positive");
  c = valid();
  c.rank = -1;
  EXPECT_PROBLEM(c, "rank = -1 must not be negative");
  c = valid();
  c.local_rank = -1;
  EXPECT_PROBLEM(c, "local_rank = -1 must not be negative");
  c = valid();
  c.master_port = 0;
  EXPECT_PROBLEM(c, "master_port = 0 must be in 1..65535");
  c = valid();
  c.master_addr = "";
  EXPECT_PROBLEM(c, "master_addr must not be empty");
  c = valid();
  c.timeout_s = 0;
  EXPECT_PROBLEM(c, "timeout_s = 0 must be in 0.001..86400 seconds");
  c = valid();
  c.timeout_s = std::nan("");
  EXPECT_PROBLEM(c, "timeout_s = nan must be in 0.001..86400 seconds");
  c = valid();
  c.timeout_s = 2.5;
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(c.timeout(), std::chrono::milliseconds(2500));
}

TEST(DistributedConfig, WorldSizeIsNodesTimesProcessesPerNode) {
  DistributedConfig c = valid();
  c.num_processes_per_node = 3;
  EXPECT_PROBLEM(c, "world_size = 8 must equal num_nodes x num_processes_per_node = 1 x 3 = 3");
}

TEST(DistributedConfig, ProcessesPerNodeThatCannotBeDerived) {
  DistributedConfig c = valid();
  c.backend = BackendChoice::Mpi;
  c.world_size = 6;
  c.tensor_parallel_size = 1;
  c.num_nodes = 4;
  c.num_processes_per_node = 0;
  c = config::resolve(c, env_of({}));
  EXPECT_PROBLEM(c,
                 "num_processes_per_node cannot be derived: world_size = 6 is not divisible "
                 "by num_nodes = 4");
}

TEST(DistributedConfig, TensorTimesPipelineDividesWorldSize) {
  DistributedConfig c = valid();
  c.tensor_parallel_size = 3;
  EXPECT_PROBLEM(c,
                 "tensor_parallel_size x pipeline_parallel_size = 3 x 1 = 3 must divide "
                 "world_size = 8");
  c.tensor_parallel_size = 2;
  c.pipeline_parallel_size = 8;
  EXPECT_PROBLEM(c, "= 2 x 8 = 16 must divide world_size = 8");
  // The context axis takes its share of the devices too.
  c.pipeline_parallel_size = 1;
  c.context_parallel_size = 3;
  EXPECT_PROBLEM(c,
                 "tensor_parallel_size x pipeline_parallel_size x context_parallel_size = 2 x 1 x "
                 "3 = 6 must divide world_size = 8");
  c.context_parallel_size = 0;
  EXPECT_PROBLEM(c, "context_parallel_size = 0 must be positive");
}

TEST(DistributedConfig, RankBelowWorldSize) {
  DistributedConfig c = valid();
  c.rank = 8;
  EXPECT_PROBLEM(c, "rank = 8 must be below world_size = 8");
}

TEST(DistributedConfig, LocalRankBelowProcessesPerNode) {
  DistributedConfig c = valid();
  c.local_rank = 8;
  EXPECT_PROBLEM(c, "local_rank = 8 must be below num_processes_per_node = 8");
}

TEST(DistributedConfig, MeshProductIsWorldSize) {
  DistributedConfig c = valid();
  c.mesh_shape = {2, 2};
  c.mesh_axis_names = {"data", "model"};
  EXPECT_PROBLEM(c, "mesh_shape = [2, 2] has 4 devices but world_size is 8");
}

TEST(DistributedConfig, AxisNamesOnePerDimension) {
  DistributedConfig c = valid();
  c.mesh_shape = {4, 2};
  c.mesh_axis_names = {"data"};
  EXPECT_PROBLEM(c,
                 "mesh_axis_names = [\"data\"] has 1 names for the 2 dimensions of mesh_shape "
                 "= [4, 2]");
  c.mesh_shape = {};
  EXPECT_PROBLEM(c, "mesh_axis_names = [\"data\"] needs a mesh_shape with one size per name");
}

TEST(DistributedConfig, AxisNamesUniqueAndNonEmpty) {
  DistributedConfig c = valid();
  c.tensor_parallel_size = 1;
  c.mesh_shape = {4, 2};
  c.mesh_axis_names = {"data", "data"};
  EXPECT_PROBLEM(c, "names \"data\" more than once");
  c.mesh_axis_names = {"data", ""};
  EXPECT_PROBLEM(c, "has an empty name");
}

TEST(DistributedConfig, MeshSizesPositiveAndAtMostFourAxes) {
  DistributedConfig c = valid();
  c.mesh_shape = {8, 0};
  c.mesh_axis_names = {"data", "model"};
  EXPECT_PROBLEM(c, "mesh_shape = [8, 0] has a size below 1");
  c.tensor_parallel_size = 1;
  c.mesh_shape = {1, 1, 1, 1, 8};
  c.mesh_axis_names = {"a", "b", "c", "d", "e"};
  EXPECT_PROBLEM(c, "has 5 dimensions; a mesh has at most 4");
}

TEST(DistributedConfig, TensorAndPipelineSizesMatchTheMesh) {
  DistributedConfig c = valid();  // tp = 2
  c.mesh_shape = {2, 4};
  c.mesh_axis_names = {"data", "model"};
  EXPECT_PROBLEM(c, "tensor_parallel_size = 2 but the mesh's \"model\" axis has size 4");
  c.tensor_parallel_size = 4;
  c.pipeline_parallel_size = 2;
  EXPECT_PROBLEM(c, "pipeline_parallel_size = 2 but the mesh's \"pipe\" axis has size 1");
  c.pipeline_parallel_size = 1;
  c.context_parallel_size = 2;
  EXPECT_PROBLEM(c, "context_parallel_size = 2 but the mesh's \"context\" axis has size 1");
}

TEST(DistributedConfig, DisabledMeansOneDevice) {
  DistributedConfig c = valid();
  c.enabled = false;
  EXPECT_PROBLEM(c, "enabled = false runs on one device, but world_size = 8");
}

TEST(DistributedConfig, BackendRules) {
  DistributedConfig c = valid();
  c.backend = BackendChoice::Nccl;
  c.device = "auto";
  if (comm::backend_available(comm::Backend::Nccl)) {
    EXPECT_TRUE(c.problems().empty()) << problems(c);
    EXPECT_EQ(c.comm_backend(), comm::Backend::Nccl);
  } else {
    EXPECT_PROBLEM(c, "backend = \"nccl\" but this build has no NCCL");
  }
  c.device = "cuda:1";
  EXPECT_EQ(problems(c).find("runs on GPUs"), std::string::npos) << problems(c);
  c.device = "cpu";
  EXPECT_PROBLEM(c, "backend = \"nccl\" runs on GPUs, but device = \"cpu\"");
  c = valid();
  c.num_nodes = 2;
  c.num_processes_per_node = 4;
  EXPECT_PROBLEM(c, "backend = \"threads\" runs in one process on one node, but num_nodes = 2");
  c = valid();
  c.launched_processes = 4;
  c.launcher_source = "PMI_RANK/PMI_SIZE";
  EXPECT_PROBLEM(c,
                 "backend = \"threads\" runs in one process, but the launcher "
                 "(PMI_RANK/PMI_SIZE) started 4");
  if (!comm::backend_available(comm::Backend::Mpi)) {
    c = valid();
    c.backend = BackendChoice::Mpi;
    EXPECT_PROBLEM(c, "this build has no MPI");
  }
}

TEST(DistributedConfig, ValidateListsEveryProblemInOneError) {
  DistributedConfig c = valid();
  c.rank = 9;
  c.tensor_parallel_size = 3;
  try {
    c.validate("configs/x.toml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[DistributedConfig] configs/x.toml: 2 problems:"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("\n  - rank = 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\n  - tensor_parallel_size x pipeline_parallel_size"), std::string::npos)
        << msg;
  }
}

TEST(DistributedConfig, ResolveWithoutLauncher) {
  DistributedConfig c;  // everything auto
  c.tensor_parallel_size = 2;
  c.mesh_shape = {2, 2};
  c.mesh_axis_names = {"data", "model"};
  c = config::resolve(c, env_of({}));
  EXPECT_EQ(c.backend, BackendChoice::Threads);
  EXPECT_EQ(c.world_size, 4);  // from the mesh
  EXPECT_EQ(c.num_processes_per_node, 4);
  EXPECT_EQ(c.launcher, "none");
  EXPECT_NO_THROW(c.validate());
}

TEST(DistributedConfig, ResolveUnderOpenMpiTakesTheLaunchersRanks) {
  DistributedConfig c;
  c.world_size = 2;  // the launcher's 4 win
  c = config::resolve(c, env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                 {"MASTER_ADDR", "node0"},
                                 {"MASTER_PORT", "1234"}}));
  if (comm::backend_available(comm::Backend::Mpi)) {
    EXPECT_EQ(c.backend, BackendChoice::Mpi);
    EXPECT_EQ(c.rank, 3);
    EXPECT_EQ(c.world_size, 4);
    EXPECT_EQ(c.local_rank, 1);
    EXPECT_EQ(c.num_nodes, 2);
    EXPECT_EQ(c.num_processes_per_node, 2);
    EXPECT_FALSE(c.is_main_process());
    EXPECT_FALSE(c.is_local_main_process());
    EXPECT_NO_THROW(c.validate());
  }
  EXPECT_EQ(c.launcher, "openmpi");
  EXPECT_EQ(c.master_addr, "node0");
  EXPECT_EQ(c.master_port, 1234);
}

TEST(DistributedConfig, ResolveUnderSlurmAndPmiAndRank) {
  DistributedConfig c;
  c.backend = BackendChoice::Mpi;
  const DistributedConfig slurm = config::resolve(c, env_of({{"SLURM_PROCID", "5"},
                                                             {"SLURM_NTASKS", "8"},
                                                             {"SLURM_LOCALID", "1"},
                                                             {"SLURM_NNODES", "2"}}));
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 8);
  EXPECT_EQ(slurm.num_nodes, 2);
  EXPECT_EQ(slurm.num_processes_per_node, 4);
  EXPECT_EQ(slurm.launcher, "slurm");
  const DistributedConfig pmi = config::resolve(c, env_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  EXPECT_EQ(pmi.rank, 1);
  EXPECT_EQ(pmi.world_size, 2);
  EXPECT_EQ(pmi.launcher, "pmi");
  const DistributedConfig torchrun = config::resolve(
      c,
      env_of({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}}));
  EXPECT_EQ(torchrun.rank, 2);
  EXPECT_EQ(torchrun.world_size, 4);
  EXPECT_EQ(torchrun.num_nodes, 2);
  EXPECT_EQ(torchrun.launcher, "env");
}

TEST(DistributedConfig, MeshMismatchNamesTheLauncher) {
  DistributedConfig c;
  c.backend = BackendChoice::Mpi;
  c.tensor_parallel_size = 4;
  c.mesh_shape = {2, 4};
  c.mesh_axis_names = {"data", "model"};
  c = config::resolve(c, env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_PROBLEM(c,
                 "mesh_shape = [2, 4] has 8 devices but world_size is 4 (from "
                 "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)");
}

TEST(DistributedConfig, ThreadsUnderALauncherIsAnError) {
  DistributedConfig c = valid();
  c = config::resolve(c, env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  EXPECT_EQ(c.world_size, 8);  // threads: the launcher's ranks are not ours
  EXPECT_PROBLEM(c,
                 "backend = \"threads\" runs in one process, but the launcher (RANK/WORLD_SIZE) "
                 "started 2");
}

TEST(DistributedConfig, BuildMeshFromSizes) {
  DistributedConfig c = valid();  // 8 = data 4 x model 2
  const mesh::Mesh m = config::build_mesh(c);
  EXPECT_EQ(m.axis_names(), (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(m.shape(), (std::vector<int>{4, 2}));
  c.tensor_parallel_size = 1;
  EXPECT_EQ(config::build_mesh(c).shape(), (std::vector<int>{8}));
  EXPECT_EQ(config::build_mesh(c, {"data", "model"}).shape(), (std::vector<int>{8, 1}));
  c.tensor_parallel_size = 2;
  c.pipeline_parallel_size = 2;
  const mesh::Mesh three = config::build_mesh(c);
  EXPECT_EQ(three.axis_names(), (std::vector<std::string>{"data", "model", "pipe"}));
  EXPECT_EQ(three.shape(), (std::vector<int>{2, 2, 2}));
  // (data, context, model, pipe): the model axis innermost but for the pipeline.
  c.pipeline_parallel_size = 1;
  c.context_parallel_size = 2;
  EXPECT_EQ(c.data_parallel_size(), 2);
  const mesh::Mesh with_context = config::build_mesh(c);
  EXPECT_EQ(with_context.axis_names(), (std::vector<std::string>{"data", "context", "model"}));
  EXPECT_EQ(with_context.shape(), (std::vector<int>{2, 2, 2}));
}

TEST(DistributedConfig, BuildMeshExplicit) {
  DistributedConfig c = valid();
  c.tensor_parallel_size = 1;
  c.mesh_shape = {2, 4};
  c.mesh_axis_names = {"data", "fsdp"};
  const mesh::Mesh m = config::build_mesh(c);
  EXPECT_EQ(m.describe(), "(\"data\"=2, \"fsdp\"=4)");
  EXPECT_THROW(config::build_mesh(c, {"data", "model"}), ConfigError);
  c.mesh_shape = {2, 2};
  EXPECT_THROW(config::build_mesh(c), ConfigError);  // validates first
}

// `device` names where tensors live: parsed, refused with the rule when it names none; a
// CUDA device validates anywhere and is placed only where that GPU exists (else the
// placement says why).
TEST(DistributedConfig, DeviceNamesTheDeviceOrSaysWhyNot) {
  DistributedConfig c = valid();
  EXPECT_EQ(c.placement(), default_device());
  c.device = "checked";
  EXPECT_EQ(c.placement(), (Device{DeviceKind::Checked, 0}));
  EXPECT_TRUE(c.problems().empty());
  c.device = "gpu";
  EXPECT_THROW((void)c.placement(), ConfigError);
  auto problems = c.problems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("device = \"gpu\" names no device"), std::string::npos) << problems[0];
  c.device = "cuda:0";
  EXPECT_TRUE(c.problems().empty());
  if (tensor::cuda_device_count() > 0) {
    EXPECT_EQ(c.placement(), (Device{DeviceKind::CUDA, 0}));
  } else {
    try {
      (void)c.placement();
      ADD_FAILURE() << "placed on cuda:0 without a GPU";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(tensor::cuda_unavailable_reason()), std::string::npos)
          << e.what();
    }
  }
  c.device = "cuda:99";
  EXPECT_THROW((void)c.placement(), ConfigError);
}

// Under backend nccl, "auto" and "cuda" name the process's GPU, the one launch_nccl picks
// (cuda:(local_rank % GPUs)); without a GPU the placement says why.
TEST(DistributedConfig, NcclPlacesOnTheProcesssGpu) {
  DistributedConfig c = valid();
  c.backend = BackendChoice::Nccl;
  c.local_rank = 3;
  for (const char* name : {"auto", "cuda"}) {
    c.device = name;
    const int gpus = tensor::cuda_device_count();
    if (gpus > 0) {
      EXPECT_EQ(c.placement(), (Device{DeviceKind::CUDA, 3 % gpus})) << name;
    } else {
      try {
        (void)c.placement();
        ADD_FAILURE() << "backend nccl placed without a GPU (device = " << name << ")";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(tensor::cuda_unavailable_reason()), std::string::npos)
            << e.what();
      }
    }
  }
  c.backend = BackendChoice::Threads;
  c.device = "auto";
  EXPECT_EQ(c.placement(), default_device());
}
