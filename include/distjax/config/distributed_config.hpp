// DistributedConfig: how many devices, where they run, how they form a mesh, and its
// validation; filled from config files, --set overrides and the launcher's environment.
#pragma once

#include <cstdint>
#include <chrono>
#include <string>
#include <vector>

#include "distjax/comm/launch.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/mesh/mesh.hpp"

namespace distjax::config {

/// The backend a config asks for. Auto: Mpi when a launcher (mpirun, srun) started the
/// process, Threads otherwise. Nccl (one GPU per process) is refused by validate() in a
/// build without NCCL and with a device other than auto or cuda.
enum class BackendChoice : std::uint8_t { Auto, Threads, Mpi, Nccl };
/// "auto", "threads", "mpi", "nccl".
const char* backend_choice_name(BackendChoice b);

/// Compute precision of a run: "no" (f32), "fp16" or "bf16".
enum class MixedPrecision : std::uint8_t { No, Fp16, Bf16 };
/// "no", "fp16", "bf16".
const char* mixed_precision_name(MixedPrecision m);

/// The distributed setup of a run, with the fields of the JAX toolkits' DistributedConfig.
/// A device is a process under mpi (one device per process) and a thread under threads.
///
///   DistributedConfig c;
///   c.world_size = 8;
///   c.tensor_parallel_size = 4;
///   c = resolve(c, comm::discover_launch_environment());   // auto fields, launcher's ranks
///   c.validate();          // throws ConfigError listing every broken rule
///   mesh::Mesh m = build_mesh(c, {"data", "model"});       // ("data"=2, "model"=4)
struct DistributedConfig {
  bool enabled = true;  ///< false: one device (world_size, tp and pp must be 1)
  int world_size = 0;   ///< devices in total; 0 = derive (launcher, mesh_shape, tp x pp)
  BackendChoice backend = BackendChoice::Auto;
  int rank = 0;        ///< this process's rank (the launcher's under mpi)
  int local_rank = 0;  ///< rank on this node
  int num_nodes = 1;
  int num_processes_per_node = 0;            ///< devices per node; 0 = world_size / num_nodes
  std::string master_addr = "localhost";     ///< rendezvous address (for nccl; MASTER_ADDR)
  int master_port = 29500;                   ///< rendezvous port (MASTER_PORT)
  int tensor_parallel_size = 1;              ///< size of the "model" axis
  int pipeline_parallel_size = 1;            ///< size of the "pipe" axis
  int context_parallel_size = 1;             ///< size of the "context" axis (the sequence split)
  /// size of the "expert" axis (the experts split): carved out of the data-parallel devices,
  /// which it divides; the mesh's "data" axis keeps data_parallel_size / expert_parallel_size
  int expert_parallel_size = 1;
  std::vector<int> mesh_shape;               ///< explicit mesh; empty = (data, model, pipe)
  std::vector<std::string> mesh_axis_names;  ///< one name per mesh_shape entry
  MixedPrecision mixed_precision = MixedPrecision::No;
  /// Where the devices' tensors live: "auto" (the process default: the CPU, or the
  /// DISTJAX_DEVICE environment variable), "cpu", "checked" (the checked device: the
  /// CPU's kernels on memory the host may touch only through them), or "cuda".
  std::string device = "auto";
  /// Seconds a collective or transfer may wait for the other devices: past it, every
  /// device of the call fails, saying which devices (and, under MPI, which hosts) did not
  /// arrive or answer. A host lost mid-run is reported after it.
  double timeout_s = 30.0;

  /// Set by resolve(): the launcher found in the environment ("none", "openmpi", ...),
  /// the variables that gave the ranks, and how many processes it started.
  std::string launcher = "none";
  std::string launcher_source;
  int launched_processes = 1;

  /// world_size / (tensor_parallel_size x pipeline_parallel_size x context_parallel_size):
  /// the devices that see different examples ("data" x "expert").
  int data_parallel_size() const;
  /// rank == 0: the process that prints and writes the run's files.
  bool is_main_process() const { return rank == 0; }
  /// local_rank == 0: the process that does per-node work.
  bool is_local_main_process() const { return local_rank == 0; }
  /// The backend to launch with: Threads, Mpi or Nccl (call on a resolved config).
  comm::Backend comm_backend() const;
  /// The device `device` names (ConfigError when it names none, or a GPU this machine lacks).
  /// Under backend nccl, "auto" and "cuda" name this process's GPU, cuda:(local_rank % GPUs),
  /// the one its launch uses.
  Device placement() const;
  /// timeout_s as the launch's timeout.
  std::chrono::milliseconds timeout() const;

  /// One message per broken rule (empty when valid): sizes positive, world_size =
  /// num_nodes x num_processes_per_node, tp x pp divides world_size, rank < world_size,
  /// local_rank < num_processes_per_node, mesh_shape's product = world_size, as many
  /// mesh_axis_names as mesh_shape entries, names unique and non-empty, tp/pp/cp equal to
  /// the "model"/"pipe"/"context" axes of an explicit mesh, the backend built in, threads in one process.
  std::vector<std::string> problems() const;
  /// Throws ConfigError "[DistributedConfig] N problems:\n  - ...\n  - ..." listing
  /// every message of problems(); `context` (e.g. the file) is named in the first line.
  void validate(const std::string& context = "") const;
};

/// Fills what the config leaves open: backend Auto from the environment; under a
/// multi-process backend, rank, world_size, local_rank, num_nodes, num_processes_per_node
/// (and master_addr / master_port when set) from the launcher; world_size 0 from
/// mesh_shape or tp x pp (1 when not enabled); num_processes_per_node 0 as world_size /
/// num_nodes. Does not validate.
DistributedConfig resolve(DistributedConfig config, const comm::LaunchEnvironment& env);

/// The mesh of a validated config: mesh_shape / mesh_axis_names when given, else the
/// axes "data" (data_parallel_size), "context" (context_parallel_size), "model"
/// (tensor_parallel_size), "pipe" (pipeline_parallel_size), in that order (the model axis
/// innermost but for the pipeline), each kept when its size is > 1 or it is in
/// `required_axes`.
/// Throws ConfigError when an explicit mesh lacks a required axis.
mesh::Mesh build_mesh(const DistributedConfig& config,
                      const std::vector<std::string>& required_axes = {"data"});

}  // namespace distjax::config
