// The threads backend's launch: one thread per simulated device, each with its world
// communicator (see launch.hpp).
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distjax/comm/detail/backends.hpp"
#include "distjax/comm/detail/launch_helpers.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/comm/threads/threads_communicator.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/device_memory.hpp"

namespace distjax::comm::detail {

void launch_threads(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn) {
  DISTJAX_CHECK(opts.num_devices >= 1, InvalidArgument,
                "[launch] num_devices must be >= 1, got ", opts.num_devices);
  DISTJAX_CHECK(opts.timeout.count() > 0, InvalidArgument, "[launch] timeout must be > 0 ms");
  const int n = opts.num_devices;
  auto world = std::make_shared<threads::WorldState>(opts);
  std::vector<int> members(n);
  for (int d = 0; d < n; ++d) members[d] = d;
  auto world_group = std::make_shared<threads::GroupState>(world, members);
  world->register_group(world_group);
  const int omp_threads = intra_op_threads_for(opts, n);

  // What the caller queued before the launch (its inputs, made on its own stream): each
  // device thread's stream waits for it on the device before its first kernel, so a device
  // reading the caller's tensors follows their writers (on the GPU, without a host wait).
  const tensor::raw::Event inputs_ready = tensor::raw::Event::record("launch", opts.device);

  std::mutex err_mu;
  std::exception_ptr first_error;
  int first_device = -1;
  auto run_device = [&](int d) {
    set_intra_op_threads(omp_threads);
    set_current_device(opts.device);
    try {
      inputs_ready.stream_wait();
      Communicator c(std::make_shared<threads::ThreadsCommunicator>(
          world, world_group, d, std::make_shared<CommStats>()));
      fn(c);
      // Its outputs are read by the caller after the join, on another stream; and the last
      // work's errors are the device's own.
      tensor::raw::synchronize("launch", current_device());
    } catch (...) {
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      {
        std::lock_guard lk(err_mu);
        if (!first_error) {
          first_error = std::current_exception();
          first_device = d;
        }
      }
      world->abort_all("[launch] aborted because device " + std::to_string(d) +
                       " failed: " + what);
      threads::finish_thread_work(current_device());  // its stream still waits, quietly
    }
    world->device_exited(d);
  };
  // Every device, even a single one, gets its own thread: its tape and OpenMP settings
  // are thread-local and must not leak into the caller's.
  // A thread the system cannot start (out of memory for its stack, or a limit on threads)
  // stops the devices already running, as a device's failure does, before they are joined:
  // they may be waiting for the missing one in a collective.
  std::vector<std::thread> threads;
  threads.reserve(n);
  std::string not_started;
  for (int d = 0; d < n && not_started.empty(); ++d) {
    try {
      threads.emplace_back(run_device, d);
    } catch (const std::system_error& e) {
      not_started = "[launch] could not start the thread of device " + std::to_string(d) +
                    " of " + std::to_string(n) + ": " + e.what() +
                    " (out of memory, or a limit on threads or address space: ulimit -u, -v)";
      world->abort_all(not_started);
    }
  }
  for (auto& t : threads) t.join();
  if (!not_started.empty()) DISTJAX_THROW(Error, not_started);
  if (first_error) rethrow_with_device(first_error, first_device);
}

}  // namespace distjax::comm::detail
