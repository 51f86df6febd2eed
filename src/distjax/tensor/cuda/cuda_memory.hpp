// Device memory of the CUDA backend: one block per call, straight from the runtime. The
// declarations need no CUDA header, so the stub (tensor/cuda_stub/) implements them too.
#pragma once

#include <cstddef>

namespace distjax::tensor::cuda {

/// `nbytes` of memory on CUDA device `device` (cudaMalloc, 256-byte aligned; nullptr for 0
/// bytes). Throws distjax::Error naming the device when the allocation fails, and
/// NotImplemented in a build without CUDA.
/// Each call allocates: the stream-ordered caching allocator is still to come.
void* cuda_alloc(std::size_t nbytes, int device);

/// Frees a block of cuda_alloc(nbytes, device) (same nbytes and device; nullptr is a no-op).
/// cudaFree waits for the device's work to finish first. Throws distjax::Error when the
/// runtime reports an error (an earlier kernel fault shows here too).
void cuda_free(void* p, std::size_t nbytes, int device);

}  // namespace distjax::tensor::cuda
