// The NCCL backend's launch: this process's GPU, NCCL's unique id shared over MPI (which
// stays the host communicator), a file store or nobody (world size 1), the world's NCCL
// communicator created non-blocking and polled against the timeout, then the program.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/detail/launch_helpers.hpp"
#include "distjax/comm/detail/nccl_bootstrap.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/comm/nccl/nccl_communicator.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda_runtime.hpp"

namespace distjax::comm::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The world's NCCL communicator of rank `rank` of `world_size` from `id`, on `device`.
ncclComm_t init_world(const ncclUniqueId& id, int rank, int world_size, int device,
                      std::chrono::milliseconds timeout) {
  DISTJAX_CUDA_CHECK(cudaSetDevice(device), "launch");
  ncclConfig_t config;
  nccl::nccl_config(config);
  ncclComm_t comm = nullptr;
  ncclUniqueId copy = id;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, copy, rank, &config);
  try {
    nccl::nccl_settle(comm, r, "launch", "ncclCommInitRankConfig", device, Clock::now() + timeout);
  } catch (...) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw;
  }
  return comm;
}

// Runs fn with the NCCL world of this process (host: the MPI world, or invalid).
void run(const NcclBootstrapPlan& plan, const ncclUniqueId& id, int device,
         const LaunchOptions& opts, Communicator host,
         const std::function<void(Communicator&)>& fn) {
  const DeviceScope on_device(Device{DeviceKind::CUDA, device});
  ncclComm_t comm = init_world(id, plan.rank, plan.world_size, device, opts.timeout);
  // Every rank has read the id once the communicator exists: the store may forget it.
  if (plan.how == NcclBootstrap::FileStore && plan.rank == 0)
    std::remove(nccl_store_path(plan.store, plan.world_size).c_str());
  std::vector<int> members(static_cast<std::size_t>(plan.world_size));
  std::iota(members.begin(), members.end(), 0);
  const nccl::NcclSettings settings{device, opts.timeout, opts.half_reduce_in_f32};
  Communicator world(nccl::make_communicator(comm, plan.rank, std::move(members), std::move(host),
                                             settings, std::make_shared<CommStats>()));
  fn(world);
}

}  // namespace

void launch_nccl(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn) {
  // The launch's own mistakes first, so a machine without a GPU reports them too.
  DISTJAX_CHECK(opts.devices_per_process == 1, NotImplemented,
                "[launch] the nccl backend runs one GPU per process (NCCL refuses two ranks on "
                "one GPU); devices_per_process=",
                opts.devices_per_process, " is not implemented");
  DISTJAX_CHECK(opts.timeout.count() > 0, InvalidArgument, "[launch] timeout must be > 0 ms");
  const LaunchEnvironment env = discover_launch_environment();
  const NcclBootstrapPlan plan =
      plan_nccl_bootstrap(env, mpi_available(), std::getenv("DISTJAX_NCCL_STORE"));
  DISTJAX_CHECK(opts.num_devices <= 1 || opts.num_devices == plan.world_size, ConfigError,
                "[launch] num_devices=", opts.num_devices, " but the nccl backend's world has ",
                plan.world_size, " processes x 1 GPU (", nccl_bootstrap_name(plan.how), ")");
  const int gpus = tensor::cuda_device_count();
  DISTJAX_CHECK(gpus > 0, NotImplemented,
                "[launch] backend nccl needs a GPU: ", tensor::cuda_unavailable_reason());
  const int device = plan.local_rank % gpus;

  if (plan.how == NcclBootstrap::Mpi) {
    // MPI runs the launch (its failure notices, its finish) and stays the host communicator.
    LaunchOptions host_opts = opts;
    host_opts.backend = Backend::Mpi;
    host_opts.device = Device{DeviceKind::CUDA, device};
    return launch_mpi(host_opts, [&](Communicator& host) {
      ncclUniqueId id{};
      if (host.rank() == 0) {
        const ncclResult_t r = ncclGetUniqueId(&id);
        DISTJAX_CHECK(r == ncclSuccess, CommError,
                      "[launch] ncclGetUniqueId failed: ", ncclGetErrorString(r));
      }
      static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0);
      host.broadcast(&id, sizeof(id) / sizeof(std::int32_t), DType::I32, 0);
      NcclBootstrapPlan p = plan;
      p.rank = host.rank();
      p.world_size = host.size();
      run(p, id, device, opts, host, fn);
    });
  }

  set_intra_op_threads(intra_op_threads_for(opts, 1));
  try {
    ncclUniqueId id{};
    if (plan.rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      DISTJAX_CHECK(r == ncclSuccess, CommError,
                    "[launch] ncclGetUniqueId failed: ", ncclGetErrorString(r));
      if (plan.how == NcclBootstrap::FileStore)
        store_put(nccl_store_path(plan.store, plan.world_size), &id, sizeof(id));
    } else {
      const std::vector<char> bytes =
          store_get(nccl_store_path(plan.store, plan.world_size), sizeof(id), opts.timeout);
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    run(plan, id, device, opts, Communicator(), fn);
  } catch (...) {
    rethrow_with_device(std::current_exception(), plan.rank);
  }
}

}  // namespace distjax::comm::detail
