// The MPI backend's launch: MPI initialised once per process (finalized at exit), one
// device per process, MPI_COMM_WORLD's errors returned instead of fatal while the device
// program runs, a failing program's notice sent to every other process before launch
// rethrows, and a finished program's notice sent before launch waits for the others' and
// returns (notices.hpp; see mpi_communicator.cpp for the communicator itself).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/detail/host_staging.hpp"
#include "distjax/comm/detail/launch_helpers.hpp"
#include "distjax/comm/mpi/guards.hpp"
#include "distjax/comm/mpi/hosts.hpp"
#include "distjax/comm/mpi/lifelines.hpp"
#include "distjax/comm/mpi/mpi_communicator.hpp"
#include "distjax/comm/mpi/notices.hpp"
#include "distjax/comm/mpi/watchdog.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi {

using namespace guards;

namespace {

// The end of a launch whose program returned: tells the others, then waits until every
// other process has finished or failed (after an abort notice only for the grace period: a
// process that learned of a failure from a notice sends none), and throws if one failed
// because this device left it waiting. Twice the timeout: a peer may start waiting on a
// call this device completed a little after it finished, and its diagnosis at its own
// timeout asks this device for its records (poll_until answers).
void finish_epoch(std::chrono::milliseconds timeout, int device) {
  if (!send_finished()) return;
  poll_until([] { return heard_from_all(); }, Clock::now() + 2 * timeout);
  throw_if_blamed(device);
}

// Every collective runs in its nonblocking form (so no rank can hang, see the top of this
// file). Open MPI's default choice for MPI_Iallreduce (libnbc) measured ~0.6x of the
// blocking MPI_Allreduce at 4 MiB on 2 ranks; its ring algorithm measured 1.4x at 4 MiB
// and 2.4x at 64 MiB (bench_comm). Open MPI reads MCA parameters from the environment
// at MPI_Init, which may happen in the user's main, so the default is set when the
// library loads; a value the user already set is kept.
const bool g_iallreduce_ring = [] {
  return setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0) == 0;
}();

// Every process's host name, gathered on `world` unless an earlier launch did.
void gather_hosts(MPI_Comm world, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout, int rank) {
  if (!world_hosts().empty()) return;
  int size = 1;
  MPI_Comm_size(world, &size);
  constexpr int kNameBytes = 64;  // a host name of up to 63 bytes (HOST_NAME_MAX is 64)
  std::array<char, kNameBytes> mine{};
  if (gethostname(mine.data(), kNameBytes - 1) != 0) std::strcpy(mine.data(), "?");
  auto all = std::make_shared<std::vector<char>>(static_cast<std::size_t>(size) * kNameBytes);
  MPI_Request r;
  check(MPI_Iallgather(mine.data(), kNameBytes, MPI_CHAR, all->data(), kNameBytes, MPI_CHAR,
                       world, &r),
        "launch", rank);
  wait_setup(r, all, deadline, timeout, "launch", "gathering the processes' hosts", rank);
  std::vector<std::string> h(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) {
    const char* p = all->data() + static_cast<std::size_t>(i) * kNameBytes;
    h[static_cast<std::size_t>(i)] = std::string(p, strnlen(p, kNameBytes));
  }
  set_world_hosts(std::move(h));
}

// Whether a launch of this process failed, and its timeout: MPI_Finalize waits for every
// process of the job, and after a failure one may be gone (a host lost) or never get there.
bool g_launch_failed = false;
std::chrono::milliseconds g_timeout{30000};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!g_launch_failed) {
    MPI_Finalize();
    return;
  }
  // The error is printed already. MPI_Finalize waits for every process of the job: with
  // one gone it would wait forever. Exiting with an error without it makes the launcher
  // end the job the way it ends every failed one (mpirun: SIGTERM, then SIGKILL), which
  // leaves the other processes time to report; MPI_Abort would kill them at once.
  if (peers_silent()) std::_Exit(1);
  const std::chrono::milliseconds limit = g_timeout;
  std::ostringstream what;
  what << "[launch] MPI_Finalize did not complete within " << limit.count()
       << " ms after the launch failed (a process of the job is gone?): aborting the job";
  Watchdog& w = Watchdog::get();
  const std::uint64_t token = w.arm(Clock::now() + limit, what.str(), /*exit_code=*/1);
  MPI_Finalize();
  w.disarm(token);
}
// Rethrows e with " (raised on device N)" appended, kept in the launch's error file if
// `keep` (the device claimed the process's account, lifelines.hpp: the sentinel is not
// giving it).
[[noreturn]] void rethrow_kept(std::exception_ptr e, int device, bool keep,
                               const std::string& error_file) {
  try {
    detail::rethrow_with_device(e, device);
  } catch (const std::exception& x) {
    if (keep) keep_error(error_file, x.what());
    throw;
  }
}
}  // namespace

}  // namespace distjax::comm::mpi

namespace distjax::comm::detail {

void launch_mpi(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    mpi::check(rc, "launch", -1);
    std::atexit(mpi::finalize_at_exit);
  }
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  DISTJAX_CHECK(opts.devices_per_process == 1, NotImplemented,
                "[launch] the MPI backend runs one device per process; devices_per_process=",
                opts.devices_per_process, " is not implemented");
  DISTJAX_CHECK(opts.num_devices <= 1 || opts.num_devices == world_size, ConfigError,
                "[launch] num_devices=", opts.num_devices, " but the MPI world has ", world_size,
                " processes x 1 device per process");
  DISTJAX_CHECK(opts.timeout.count() > 0, InvalidArgument, "[launch] timeout must be > 0 ms");
  set_intra_op_threads(intra_op_threads_for(opts, 1));
  const DeviceScope on_device(opts.device);
  // Open MPI reports a failed nonblocking collective (a mismatched program in fast mode:
  // MPI_ERR_TRUNCATE) through MPI_COMM_WORLD's handler, fatal by default: return codes
  // instead while the launch runs, so the flight records can name what went wrong.
  MPI_Errhandler user_handler;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &user_handler);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  struct Restore {
    MPI_Errhandler h;
    ~Restore() {
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, h);
      MPI_Errhandler_free(&h);
    }
  } restore{user_handler};
  mpi::g_timeout = opts.timeout;
  if (!opts.error_file.empty()) {  // an earlier run's
    std::error_code ec;
    std::filesystem::remove(opts.error_file, ec);
  }
  mpi::open_epoch(opts.timeout, world_rank);
  try {
    auto world = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    MPI_Request r;
    mpi::check(MPI_Comm_idup(MPI_COMM_WORLD, world.get(), &r), "launch", world_rank);
    mpi::wait_setup(r, world, mpi::Clock::now() + opts.timeout, opts.timeout, "launch",
                    "duplicating MPI_COMM_WORLD", world_rank);
    mpi::gather_hosts(*world, mpi::Clock::now() + opts.timeout, opts.timeout, world_rank);
    mpi::open_lifelines(*world, mpi::Clock::now() + opts.timeout, opts.timeout, world_rank);
    mpi::sentinel_watch(world_rank, opts.error_file);
    // Device buffers (a GPU's, the checked device's) reach MPI through host staging.
    Communicator c(stage_device_buffers(
        mpi::make_communicator(*world, opts, std::make_shared<CommStats>(), "launch")));
    fn(c);
  } catch (...) {
    mpi::g_launch_failed = true;
    const bool account = mpi::claim_account();  // before the sentinel may, on a SIGTERM
    // Tell the other processes first, so their pending calls fail now, not at timeout.
    std::exception_ptr e = std::current_exception();
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      mpi::send_abort(ex.what());
    } catch (...) {
      mpi::send_abort("a non-standard exception");
    }
    mpi::close_epoch();
    mpi::sentinel_release();
    mpi::rethrow_kept(e, world_rank, account, opts.error_file);
  }
  // The program returned (its communicators are gone): tell the others, and fail if one
  // of them failed because this device left it waiting.
  try {
    mpi::finish_epoch(opts.timeout, world_rank);
  } catch (...) {
    mpi::g_launch_failed = true;
    const bool account = mpi::claim_account();
    mpi::close_epoch();
    mpi::sentinel_release();
    mpi::rethrow_kept(std::current_exception(), world_rank, account, opts.error_file);
  }
  mpi::close_epoch();
  mpi::sentinel_release();
}

bool mpi_available() { return true; }

}  // namespace distjax::comm::detail

namespace distjax::comm {

const std::vector<std::string>& process_hosts() { return mpi::world_hosts(); }

}  // namespace distjax::comm
