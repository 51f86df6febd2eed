// Temporary device memory of a kernel launcher (partial sums, counters, a report on its way
// to host memory), ordered on the kernel's stream: cudaMallocAsync before the kernels that
// use it, cudaFreeAsync after them, so no host synchronisation. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "distjax/tensor/cuda_runtime.hpp"

namespace distjax::tensor::cuda {

/// `nbytes` of device memory on `stream`'s device, usable by work queued on `stream` after
/// the constructor. release() queues the free (checked); the destructor queues it without a
/// check when an exception left it unreleased.
class StreamScratch {
 public:
  StreamScratch(std::size_t nbytes, cudaStream_t stream, const char* op)
      : stream_(stream), op_(op) {
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&p_, nbytes, stream), op, nbytes, " bytes of scratch");
  }
  ~StreamScratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

  void release() {
    void* p = p_;
    p_ = nullptr;
    DISTJAX_CUDA_CHECK(cudaFreeAsync(p, stream_), op_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
  const char* op_;
};

}  // namespace distjax::tensor::cuda
