// The NCCL backend's bootstrap plan and file store (see nccl_bootstrap.hpp).
#include "distjax/comm/detail/nccl_bootstrap.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

const char* nccl_bootstrap_name(NcclBootstrap b) {
  switch (b) {
    case NcclBootstrap::Single:
      return "single";
    case NcclBootstrap::Mpi:
      return "mpi";
    case NcclBootstrap::FileStore:
      return "file store";
  }
  return "?";
}

NcclBootstrapPlan plan_nccl_bootstrap(const LaunchEnvironment& env, bool mpi_built,
                                      const char* store_dir) {
  NcclBootstrapPlan p;
  p.rank = env.rank;
  p.world_size = env.world_size;
  p.local_rank = env.local_rank;
  const bool mpi_launcher = env.launcher == Launcher::OpenMpi || env.launcher == Launcher::Pmi ||
                            env.launcher == Launcher::Slurm;
  if (env.launcher == Launcher::None || (env.world_size == 1 && !mpi_launcher)) {
    p.how = NcclBootstrap::Single;
    p.rank = 0;
    p.world_size = 1;
    return p;
  }
  // MPI is the first choice under an MPI launcher: it also serves as the host communicator
  // (control values, the diagnosis of a hang from every process's flight records).
  if (mpi_launcher && mpi_built) {
    p.how = NcclBootstrap::Mpi;
    return p;
  }
  const bool has_store = store_dir != nullptr && *store_dir != '\0';
  DISTJAX_CHECK(
      has_store, ConfigError, "[launch] backend nccl: ", env.world_size, " processes (", env.source,
      ") need a way to share NCCL's unique id: ", mpi_launcher ? "this build has no MPI, so " : "",
      "set DISTJAX_NCCL_STORE to a directory every process sees (a fresh one per run)",
      mpi_launcher ? "" : ", or start the processes with mpirun / srun in a build with MPI");
  p.how = NcclBootstrap::FileStore;
  p.store = store_dir;
  return p;
}

std::string nccl_store_path(const std::string& dir, int world_size) {
  return (std::filesystem::path(dir) / ("nccl-unique-id-" + std::to_string(world_size))).string();
}

void store_put(const std::string& path, const void* bytes, std::size_t n) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DISTJAX_CHECK(!fs::exists(path, ec), CommError, "[launch] the NCCL file store already holds ",
                path,
                " (left by an earlier run? its id would be stale): remove it, or give "
                "DISTJAX_NCCL_STORE a fresh directory per run");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DISTJAX_CHECK(fd >= 0, CommError, "[launch] cannot create ", tmp,
                " in the NCCL file store: ", std::strerror(errno));
  const char* p = static_cast<const char*>(bytes);
  std::size_t left = n;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      DISTJAX_THROW(CommError, "[launch] cannot write ", tmp, ": ", std::strerror(err));
    }
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  // Flushed before the rename, so a reader on another node never sees the name without
  // the bytes (a shared file system may reorder them otherwise).
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DISTJAX_THROW(CommError, "[launch] cannot publish ", path,
                  " in the NCCL file store: ", std::strerror(err));
  }
}

std::vector<char> store_get(const std::string& path, std::size_t n,
                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(100);
  std::size_t last_size = 0;
  bool seen = false;
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      seen = true;
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      last_size = bytes.size();
      if (bytes.size() == n) return bytes;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  DISTJAX_THROW(
      CommError, "[launch] timed out after ", timeout.count(),
      " ms waiting for NCCL's unique id in ", path, " (rank 0 writes it): ",
      seen ? "the file holds " + std::to_string(last_size) + " bytes, not " + std::to_string(n)
           : std::string("no such file"));
}

SplitMembers split_members(const std::vector<std::int64_t>& all, int rank) {
  DISTJAX_CHECK(all.size() % 3 == 0 && rank >= 0 && static_cast<std::size_t>(rank) < all.size() / 3,
                InvalidArgument, "[split] ", all.size(), " values for rank ", rank,
                " (three per rank expected)");
  const auto n = static_cast<int>(all.size() / 3);
  const auto at = [&](int r, int k) { return all[static_cast<std::size_t>(3 * r + k)]; };
  std::vector<int> same;  // ranks of this rank's color
  for (int r = 0; r < n; ++r)
    if (at(r, 0) == at(rank, 0)) same.push_back(r);
  std::stable_sort(same.begin(), same.end(), [&](int a, int b) { return at(a, 1) < at(b, 1); });
  SplitMembers out;
  for (std::size_t i = 0; i < same.size(); ++i) {
    if (same[i] == rank) out.rank = static_cast<int>(i);
    out.members.push_back(static_cast<int>(at(same[i], 2)));
  }
  return out;
}

}  // namespace distjax::comm::detail
