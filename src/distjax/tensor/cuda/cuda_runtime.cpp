// The CUDA runtime checks and device queries (see cuda_runtime.hpp and tensor/cuda.hpp).
#include "distjax/tensor/cuda_runtime.hpp"

#include <cstdlib>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"

namespace distjax::tensor {
namespace {

struct Probe {
  int count = 0;
  std::string reason;  // why count is 0
};

// Asked afresh each time (cheap once the runtime is up): CUDA_VISIBLE_DEVICES is read when
// the runtime starts, so the answer cannot change within a process anyway.
Probe probe() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // the failure is the answer here, not an error for a later check
    return {0, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err) + " (" +
                   cudaGetErrorName(err) + ")"};
  }
  if (n == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return {0, std::string("cudaGetDeviceCount found no CUDA device (CUDA_VISIBLE_DEVICES=") +
                   (visible ? visible : "<unset>") + ")"};
  }
  return {n, ""};
}

}  // namespace

bool built_with_cuda() {
  return true;
}
int cuda_device_count() {
  return probe().count;
}
std::string cuda_unavailable_reason() {
  return probe().reason;
}

namespace cuda {

void raise_cuda_error(cudaError_t err, const char* op, const char* call, const std::string& detail,
                      const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error: it is reported here, once
  int device = -1;
  const bool known = cudaGetDevice(&device) == cudaSuccess;
  cudaGetLastError();
  ::distjax::detail::raise<Error>(file, line, "[", op, "] ", call, " failed",
                                  known ? " on cuda:" + std::to_string(device) : std::string(),
                                  detail.empty() ? "" : ", ", detail, ": ", cudaGetErrorString(err),
                                  " (", cudaGetErrorName(err), ")");
}

DeviceGuard::DeviceGuard(int device, const char* op) : device_(device) {
  DISTJAX_CHECK(device >= 0, InvalidArgument, "[", op, "] expected a CUDA device index >= 0, got ",
                device);
  DISTJAX_CUDA_CHECK(cudaGetDevice(&previous_), op, "making cuda:", device, " current");
  if (previous_ != device_)
    DISTJAX_CUDA_CHECK(cudaSetDevice(device_), op, "making cuda:", device, " current");
}

DeviceGuard::~DeviceGuard() {
  // Going back to a device that was current a moment ago does not fail short of a broken
  // context, which the next checked call reports; a destructor must not throw.
  if (previous_ != device_) cudaSetDevice(previous_);
}

}  // namespace cuda
}  // namespace distjax::tensor
