// The stream a conversion is queued on. Every kernel of the table runs on the calling
// thread's stream (on CUDA, cudaStreamPerThread: each simulated device's thread orders its
// own work; the CPU runs kernels at once); the copy family's `convert` alone may be given
// another, for a communication backend that converts on its own stream.
#pragma once

namespace distjax::tensor::detail {

struct Stream {
  void* handle = nullptr;  // a cudaStream_t on CUDA; null: the calling thread's stream
};

}  // namespace distjax::tensor::detail
