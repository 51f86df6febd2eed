// Device memory of the CUDA backend: blocks of the runtime's stream-ordered pool. The
// declarations need no CUDA header, so the stub (tensor/cuda_stub/) implements them too.
#pragma once

#include <cstddef>

namespace distjax::tensor::cuda {

/// `nbytes` of memory on CUDA device `device`, from its memory pool in the order of the
/// calling thread's stream (cudaMallocFromPoolAsync on cudaStreamPerThread; 256-byte
/// aligned; nullptr for 0 bytes). Throws distjax::Error naming the device when the
/// allocation fails, and NotImplemented in a build without CUDA.
void* cuda_alloc(std::size_t nbytes, int device);

/// Frees a block of cuda_alloc(nbytes, device) (same nbytes and device; nullptr is a no-op).
/// Returned to the pool in the order of the calling thread's stream (cudaFreeAsync): work
/// queued on that stream before finishes first. A block used by another thread's stream
/// must be synchronised with this one before it is freed. Throws distjax::Error when the
/// runtime reports an error (an earlier kernel fault shows here too).
void cuda_free(void* p, std::size_t nbytes, int device);

}  // namespace distjax::tensor::cuda
