// What every backend's launch does the same way (see launch_helpers.hpp).
#include "distjax/comm/detail/launch_helpers.hpp"

#include <omp.h>

#include <algorithm>
#include <string>
#include <thread>

#include "distjax/core/error.hpp"

namespace distjax::comm::detail {

namespace {
template <class E>
bool try_rewrap(const std::exception& e, const std::string& suffix) {
  if (auto* p = dynamic_cast<const E*>(&e)) throw E(std::string(p->what()) + suffix);
  return false;
}
}  // namespace

void rethrow_with_device(std::exception_ptr ep, int device) {
  const std::string suffix = " (raised on device " + std::to_string(device) + ")";
  try {
    std::rethrow_exception(ep);
  } catch (const Error& e) {
    // Most derived first.
    try_rewrap<CommError>(e, suffix);
    try_rewrap<InvalidArgument>(e, suffix);
    try_rewrap<ShardingError>(e, suffix);
    try_rewrap<ConfigError>(e, suffix);
    try_rewrap<NotImplemented>(e, suffix);
    try_rewrap<IoError>(e, suffix);
    throw Error(std::string(e.what()) + suffix);
  } catch (const std::exception& e) {
    throw Error("[launch] device " + std::to_string(device) + " raised: " + e.what());
  } catch (...) {
    throw Error("[launch] device " + std::to_string(device) + " raised a non-standard exception");
  }
}

int intra_op_threads_for(const LaunchOptions& opts, int local_devices) {
  if (opts.intra_op_threads > 0) return opts.intra_op_threads;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores <= 0) cores = 1;
  return std::max(1, cores / std::max(1, local_devices));
}

void set_intra_op_threads(int n) { omp_set_num_threads(std::max(1, n)); }

}  // namespace distjax::comm::detail
