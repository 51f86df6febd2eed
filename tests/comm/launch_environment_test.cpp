// Launcher discovery: Open MPI, PMI, Slurm and RANK/WORLD_SIZE variables, their order,
// derived node counts, and errors naming a malformed variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "distjax/comm/launch.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/core/error.hpp"

using namespace distjax;
using comm::Launcher;

namespace {

// A fake environment: discover_launch_environment reads only these variables.
comm::LaunchEnvironment discover(const std::map<std::string, std::string>& vars) {
  return comm::discover_launch_environment([&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(LaunchEnvironment, NoLauncher) {
  const auto env = discover({});
  EXPECT_EQ(env.launcher, Launcher::None);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.master_addr.has_value());
  EXPECT_EQ(comm::default_backend(env), comm::Backend::Threads);
}

TEST(LaunchEnvironment, OpenMpi) {
  const auto env = discover({{"OMPI_COMM_WORLD_RANK", "5"},
                             {"OMPI_COMM_WORLD_SIZE", "8"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(env.launcher, Launcher::OpenMpi);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.source, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE");
  if (comm::backend_available(comm::Backend::Mpi)) {
    EXPECT_EQ(comm::default_backend(env), comm::Backend::Mpi);
  }
}

TEST(LaunchEnvironment, Pmi) {
  const auto env = discover(
      {{"PMI_RANK", "3"}, {"PMI_SIZE", "6"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "3"}});
  EXPECT_EQ(env.launcher, Launcher::Pmi);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.num_nodes, 2);
}

TEST(LaunchEnvironment, Slurm) {
  const auto env = discover({{"SLURM_PROCID", "7"},
                             {"SLURM_NTASKS", "8"},
                             {"SLURM_LOCALID", "3"},
                             {"SLURM_NNODES", "2"}});
  EXPECT_EQ(env.launcher, Launcher::Slurm);
  EXPECT_EQ(env.rank, 7);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.local_size, 4);  // derived: 8 tasks on 2 nodes
}

TEST(LaunchEnvironment, RankWorldSizeAndMaster) {
  const auto env = discover({{"RANK", "1"},
                             {"WORLD_SIZE", "2"},
                             {"LOCAL_RANK", "1"},
                             {"MASTER_ADDR", "10.0.0.1"},
                             {"MASTER_PORT", "29501"}});
  EXPECT_EQ(env.launcher, Launcher::Env);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29501);
}

TEST(LaunchEnvironment, OpenMpiWinsOverSlurmAndRank) {
  // mpirun inside a Slurm allocation: both sets of variables are present.
  const auto env = discover({{"SLURM_PROCID", "0"},
                             {"SLURM_NTASKS", "1"},
                             {"RANK", "0"},
                             {"WORLD_SIZE", "1"},
                             {"OMPI_COMM_WORLD_RANK", "2"},
                             {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(env.launcher, Launcher::OpenMpi);
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
}

TEST(LaunchEnvironment, MalformedVariableIsNamed) {
  try {
    discover({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "4"}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID = \"x1\" is not a non-negative integer"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(discover({{"MASTER_PORT", "70000"}}), InvalidArgument);
  EXPECT_THROW(discover({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), InvalidArgument);
}

TEST(LaunchEnvironment, ReadsTheProcessEnvironment) {
  ::setenv("PMI_RANK", "1", 1);
  ::setenv("PMI_SIZE", "2", 1);
  const auto env = comm::discover_launch_environment();
  ::unsetenv("PMI_RANK");
  ::unsetenv("PMI_SIZE");
  // Under a real mpirun the Open MPI variables come first; otherwise PMI's are found.
  if (std::getenv("OMPI_COMM_WORLD_RANK") == nullptr) {
    EXPECT_EQ(env.launcher, Launcher::Pmi);
    EXPECT_EQ(env.rank, 1);
    EXPECT_EQ(env.world_size, 2);
  }
}

TEST(LaunchEnvironment, BackendNames) {
  EXPECT_EQ(comm::backend_from_name("mpi"), comm::Backend::Mpi);
  EXPECT_EQ(comm::backend_from_name("threads"), comm::Backend::Threads);
  EXPECT_EQ(comm::backend_from_name("nccl"), comm::Backend::Nccl);
  EXPECT_FALSE(comm::backend_from_name("gloo").has_value());
}

// The hosts of an MPI job, as distjax prints them ("Processes: ...") and as a lost host's
// ranks are named: ranks grouped by host in order of their first rank, runs shortened.
TEST(ProcessHosts, DescribeGroupsRanksByHost) {
  using distjax::comm::describe_hosts;
  EXPECT_EQ(describe_hosts({"a", "a", "a", "a", "b", "b", "b", "b"}),
            "8 on 2 hosts: a (ranks 0-3), b (ranks 4-7)");
  EXPECT_EQ(describe_hosts({"n1", "n2", "n1", "n2", "n1"}),
            "5 on 2 hosts: n1 (ranks 0,2,4), n2 (ranks 1,3)");
  EXPECT_EQ(describe_hosts({"a", "a", "b", "a"}), "4 on 2 hosts: a (ranks 0-1,3), b (rank 2)");
  EXPECT_EQ(describe_hosts({"solo"}), "1 on 1 host: solo (rank 0)");
  // Outside MPI (this test runs without a launcher) no hosts are known.
  EXPECT_TRUE(distjax::comm::process_hosts().empty());
}
