// What this build and this machine offer of CUDA: whether the library was compiled with its
// CUDA backend, how many GPUs the runtime sees, and why there are none.
#pragma once

#include <string>

namespace distjax::tensor {

/// True when this build of DistJax has its CUDA backend (configured with
/// DISTJAX_WITH_CUDA=AUTO where nvcc was found, or =ON). Says nothing about the machine:
/// a build with CUDA runs on machines without a GPU, where cuda_device_count() is 0.
bool built_with_cuda();

/// The number of CUDA devices the runtime sees (honours CUDA_VISIBLE_DEVICES). 0, never an
/// error, when the build has no CUDA, the machine has no driver or no GPU: then
/// cuda_unavailable_reason() says which.
int cuda_device_count();

/// Why cuda_device_count() is 0, e.g. "this build has no CUDA (...)" or "cudaGetDeviceCount
/// failed: CUDA driver version is insufficient for CUDA runtime version
/// (cudaErrorInsufficientDriver)". Empty when there is a device.
std::string cuda_unavailable_reason();

}  // namespace distjax::tensor
