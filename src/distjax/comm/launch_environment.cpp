// launch_environment: reads Open MPI, PMI, Slurm and RANK/WORLD_SIZE variables.
#include "distjax/comm/launch_environment.hpp"

#include <cstdlib>
#include <string>

#include "distjax/core/error.hpp"

namespace distjax::comm {
namespace {

// One launcher's variable names; an empty name is a variable it does not set.
struct Names {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* num_nodes;
};

constexpr Names kLaunchers[] = {
    {Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", ""},
    {Launcher::Pmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""},
    {Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "", "SLURM_NNODES"},
    {Launcher::Env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", ""},
};

// The variable as an integer in [lo, hi]; nullopt when unset.
std::optional<int> read_int(const EnvLookup& getenv, const char* name, long lo, long hi) {
  if (name[0] == '\0') return std::nullopt;
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < lo || x > hi) {
    const std::string want = hi == 65535 ? "a port (1..65535)"
                             : lo == 0   ? "a non-negative integer"
                                         : "a positive integer";
    DISTJAX_THROW(InvalidArgument, "[launch environment] ", name, " = \"", v, "\" is not ", want);
  }
  return static_cast<int>(x);
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::OpenMpi:
      return "openmpi";
    case Launcher::Pmi:
      return "pmi";
    case Launcher::Slurm:
      return "slurm";
    case Launcher::Env:
      return "env";
    case Launcher::None:
      break;
  }
  return "none";
}

LaunchEnvironment discover_launch_environment(const EnvLookup& lookup) {
  const EnvLookup getenv =
      lookup ? lookup : EnvLookup([](const char* n) { return std::getenv(n); });
  constexpr long kMax = 1L << 30;
  LaunchEnvironment env;
  for (const Names& n : kLaunchers) {
    if (getenv(n.rank) == nullptr || getenv(n.size) == nullptr) continue;
    env.launcher = n.launcher;
    env.rank = *read_int(getenv, n.rank, 0, kMax);
    env.world_size = *read_int(getenv, n.size, 1, kMax);
    env.local_rank = read_int(getenv, n.local_rank, 0, kMax).value_or(0);
    env.local_size = read_int(getenv, n.local_size, 1, kMax).value_or(0);
    env.num_nodes = read_int(getenv, n.num_nodes, 1, kMax).value_or(0);
    env.source = std::string(n.rank) + "/" + n.size;
    break;
  }
  if (env.num_nodes == 0 && env.local_size > 0 && env.world_size % env.local_size == 0)
    env.num_nodes = env.world_size / env.local_size;
  // Slurm tells the nodes, not the tasks per node (SLURM_NTASKS_PER_NODE is only set
  // when asked for, and may read "4(x2)"): derive it when the tasks spread evenly.
  if (env.local_size == 0 && env.num_nodes > 0 && env.world_size % env.num_nodes == 0)
    env.local_size = env.world_size / env.num_nodes;
  if (const char* addr = getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0')
    env.master_addr = addr;
  env.master_port = read_int(getenv, "MASTER_PORT", 1, 65535);
  return env;
}

Backend default_backend(const LaunchEnvironment& env) {
  return env.launcher != Launcher::None && backend_available(Backend::Mpi) ? Backend::Mpi
                                                                           : Backend::Threads;
}

std::optional<Backend> backend_from_name(std::string_view name) {
  if (name == "threads") return Backend::Threads;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  return std::nullopt;
}

}  // namespace distjax::comm
