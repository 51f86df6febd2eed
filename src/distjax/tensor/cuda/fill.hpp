// Fill kernels of the CUDA backend. CUDA builds only (the launchers take a cudaStream_t).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace distjax::tensor::cuda {

/// p[i] = value for i in [0, n), on `stream` (the device that owns p must be current).
/// Asynchronous: returns after the launch, whose error it checks; no host synchronisation.
void cuda_fill_f32(float* p, std::int64_t n, float value, cudaStream_t stream);

}  // namespace distjax::tensor::cuda
