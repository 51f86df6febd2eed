// Device memory of the CUDA backend (see cuda_memory.hpp).
#include "distjax/tensor/cuda/cuda_memory.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/cuda_runtime.hpp"

namespace distjax::tensor::cuda {

void* cuda_alloc(std::size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  DeviceGuard guard(device, "cuda_alloc");
  void* p = nullptr;
  DISTJAX_CUDA_CHECK(cudaMalloc(&p, nbytes), "cuda_alloc", nbytes, " bytes");
  return p;
}

void cuda_free(void* p, std::size_t nbytes, int device) {
  if (p == nullptr) return;
  DeviceGuard guard(device, "cuda_free");
  DISTJAX_CUDA_CHECK(cudaFree(p), "cuda_free", nbytes, " bytes");
}

}  // namespace distjax::tensor::cuda
