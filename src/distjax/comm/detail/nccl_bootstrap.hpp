// How the NCCL backend's processes find each other (private to src/distjax/comm): the
// choice between one process alone, MPI and a file store from the launch environment, and
// the file store itself (a directory every process sees, where rank 0 leaves NCCL's unique
// id). Pure host code, compiled in every build, so the CPU suite tests it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "distjax/comm/launch_environment.hpp"

namespace distjax::comm::detail {

/// How the unique id of the world's NCCL communicator reaches every process.
enum class NcclBootstrap : std::uint8_t {
  Single,     // world size 1 and no launcher: this process makes the id itself
  Mpi,        // mpirun / srun with MPI built in: broadcast over MPI_COMM_WORLD
  FileStore,  // RANK / WORLD_SIZE (or a launcher without MPI): a file in a shared directory
};
/// "single", "mpi", "file store".
const char* nccl_bootstrap_name(NcclBootstrap b);

/// The launch of one process as the NCCL backend sees it.
struct NcclBootstrapPlan {
  NcclBootstrap how = NcclBootstrap::Single;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string store;  ///< FileStore: the directory (DISTJAX_NCCL_STORE)
};

/// The plan for a process launched as `env` describes, in a build with MPI or not
/// (`mpi_built`), with DISTJAX_NCCL_STORE = `store_dir` (nullptr: unset). Throws ConfigError
/// naming what is missing: a world of several processes with neither MPI nor a store.
NcclBootstrapPlan plan_nccl_bootstrap(const LaunchEnvironment& env, bool mpi_built,
                                      const char* store_dir);

/// The file store's name for the unique id of a world of `world_size` processes:
/// "<dir>/nccl-unique-id-<world_size>".
std::string nccl_store_path(const std::string& dir, int world_size);

/// Writes `n` bytes to `path` atomically (a temporary name in the same directory, flushed,
/// then renamed), so a reader never sees part of it. Refuses (CommError) when `path` exists
/// already: a file left by an earlier run would hand its stale id to this run's readers;
/// remove it or use a fresh directory per run.
void store_put(const std::string& path, const void* bytes, std::size_t n);

/// Waits until `path` holds exactly `n` bytes and returns them, polling (backing off to
/// 10 ms) until `timeout`; then throws CommError naming the path, the rank that should have
/// written it and what was found there.
std::vector<char> store_get(const std::string& path, std::size_t n,
                            std::chrono::milliseconds timeout);

/// The group a split gives rank `rank`: `all` holds every rank's (color, key, world rank),
/// three values per rank in rank order; the new group is the ranks of rank's color ordered
/// by key, then by rank (as MPI_Comm_split and ncclCommSplit order them).
struct SplitMembers {
  int rank = 0;              ///< position of `rank` in the new group
  std::vector<int> members;  ///< world ranks, in new-group order
};
SplitMembers split_members(const std::vector<std::int64_t>& all, int rank);

}  // namespace distjax::comm::detail
