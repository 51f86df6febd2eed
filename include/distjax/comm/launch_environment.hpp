// launch_environment: what the process launcher (mpirun, srun, a torchrun-style script)
// tells this process through its environment: rank, world size, local rank, nodes.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "distjax/comm/launch.hpp"

namespace distjax::comm {

/// Who started this process, as read from the environment.
enum class Launcher : std::uint8_t {
  None,     // no launcher variables: a plain process (the threads backend's case)
  OpenMpi,  // OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
  Pmi,      // PMI_RANK / PMI_SIZE (MPICH, Intel MPI: Hydra), MPI_LOCALRANKID / MPI_LOCALNRANKS
  Slurm,    // SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NNODES (srun)
  Env,      // RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun style)
};
/// "none", "openmpi", "pmi", "slurm", "env".
const char* launcher_name(Launcher l);

/// The launch as the environment describes it. Checked in this order, the first
/// launcher whose rank and size variables are both set wins: Open MPI, PMI, Slurm,
/// RANK/WORLD_SIZE. MASTER_ADDR / MASTER_PORT are read under every launcher.
struct LaunchEnvironment {
  Launcher launcher = Launcher::None;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 0;  // processes on this node; 0 = not told
  int num_nodes = 0;   // 0 = not told (derived as world_size / local_size when they divide)
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  /// The variables that gave rank and size, e.g. "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE",
  /// for error messages.
  std::string source;
};

/// Reads a variable; returns null when unset. The default reads the process environment.
using EnvLookup = std::function<const char*(const char*)>;

/// Reads the launcher's variables. A variable that is set but not a non-negative integer
/// (or a port outside 1..65535) throws InvalidArgument naming it:
/// `[launch environment] SLURM_PROCID = "x" is not a non-negative integer`.
LaunchEnvironment discover_launch_environment(const EnvLookup& getenv = nullptr);

/// The backend a launch implies when the user did not choose one: Mpi when a launcher
/// started this process (and MPI is built in), Threads otherwise.
Backend default_backend(const LaunchEnvironment& env);

/// "threads", "mpi" or "nccl" to a Backend; nullopt for another name.
std::optional<Backend> backend_from_name(std::string_view name);

}  // namespace distjax::comm
