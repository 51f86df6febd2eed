// The CUDA runtime as DistJax uses it: the one check macro every runtime call goes through,
// and a guard that makes a device current for a scope. For code built with the CUDA
// toolkit (the CUDA backend, and parts beside it such as the NCCL communicator); it includes
// cuda_runtime.h, so distjax.hpp does not include it.
#pragma once

#include <cuda_runtime.h>

#include <sstream>
#include <string>

namespace distjax::tensor::cuda {

/// Throws distjax::Error "[op] <call> failed on cuda:<current device>[, <detail>]:
/// <cudaGetErrorString> (<cudaGetErrorName>) (file:line)", after clearing the runtime's last
/// error (so that a later launch check does not report this one again). The device is left
/// out when the runtime cannot say which is current (no driver).
[[noreturn]] void raise_cuda_error(cudaError_t err, const char* op, const char* call,
                                   const std::string& detail, const char* file, int line);

/// The macro's end: streams the detail parts into one string.
template <class... Args>
[[noreturn]] void raise_cuda_error_parts(cudaError_t err, const char* call, const char* file,
                                         int line, const char* op, const Args&... detail) {
  std::ostringstream os;
  ((os << detail), ...);
  raise_cuda_error(err, op, call, os.str(), file, line);
}

/// Makes CUDA device `device` current until the end of the scope, then makes the previous
/// one current again. Throws (naming `op` and both devices) when the runtime refuses.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

}  // namespace distjax::tensor::cuda

/// DISTJAX_CUDA_CHECK(expr, op[, detail parts...]): evaluates the cudaError_t expression
/// `expr` once and, unless it is cudaSuccess, throws distjax::Error naming `op` (a string
/// literal), the call, the current device, the streamed detail parts and the runtime's error
/// string. After a kernel launch: DISTJAX_CUDA_CHECK(cudaGetLastError(), op).
#define DISTJAX_CUDA_CHECK(expr, ...)                                                     \
  do {                                                                                    \
    const cudaError_t distjax_cuda_err_ = (expr);                                         \
    if (distjax_cuda_err_ != cudaSuccess)                                                 \
      ::distjax::tensor::cuda::raise_cuda_error_parts(distjax_cuda_err_, #expr, __FILE__, \
                                                      __LINE__, __VA_ARGS__);             \
  } while (0)
