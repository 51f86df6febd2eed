// What every kernel file of the CUDA backend shares: the stream a kernel runs on, grid
// sizes, and the launch check. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "distjax/tensor/cuda_runtime.hpp"
#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::cuda {

/// The stream every kernel runs on: the calling thread's own default stream
/// (cudaStreamPerThread). Each simulated device's thread thus orders its work on its own.
inline cudaStream_t thread_stream() {
  return cudaStreamPerThread;
}

/// The CUDA stream of a Stream slot (convert's): the one it names, else the thread's.
inline cudaStream_t stream_of(detail::Stream s) {
  return s.handle ? static_cast<cudaStream_t>(s.handle) : thread_stream();
}

/// Threads per block of the elementwise and row kernels.
constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill a Hopper GPU several times
/// over (132 SMs x 8 resident blocks), capped so each thread loops over a large input.
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  constexpr std::int64_t kMaxBlocks = 132 * 32;
  return static_cast<unsigned>(std::clamp<std::int64_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}

}  // namespace distjax::tensor::cuda

/// After a launch: throws distjax::Error naming `op` when the launch failed.
#define DISTJAX_CUDA_LAUNCHED(op) DISTJAX_CUDA_CHECK(cudaGetLastError(), op)
