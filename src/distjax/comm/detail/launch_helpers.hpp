// What every backend's launch does the same way: the OpenMP threads of each device and
// the rethrow of a device's error naming the device.
#pragma once

#include <exception>

#include "distjax/comm/launch.hpp"

namespace distjax::comm::detail {

/// Rewraps an exception thrown on device `device` so its message names the device,
/// keeping distjax error types; rethrows it.
[[noreturn]] void rethrow_with_device(std::exception_ptr e, int device);

/// OpenMP threads per device for `local_devices` devices in this process.
int intra_op_threads_for(const LaunchOptions& opts, int local_devices);
void set_intra_op_threads(int n);

}  // namespace distjax::comm::detail
