// Stub of the CUDA backend for builds without CUDA: every query answers "none", and memory
// on a CUDA device is refused, saying what is missing.
#include <atomic>
#include <string>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda/cuda_memory.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {

bool built_with_cuda() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::string cuda_unavailable_reason() {
  return "this build has no CUDA (DISTJAX_WITH_CUDA=OFF or nvcc not found)";
}

namespace cuda {

void* cuda_alloc(std::size_t nbytes, int device) {
  DISTJAX_THROW(NotImplemented, "[cuda_alloc] cannot allocate ", nbytes, " bytes on cuda:", device,
                ": this build of DistJax has no CUDA backend; reconfigure where nvcc is found "
                "(/usr/local/cuda/bin) with -DDISTJAX_WITH_CUDA=AUTO or ON");
}

// Nothing can have come from cuda_alloc in this build: freeing nullptr is all there is.
void cuda_free(void* p, std::size_t nbytes, int device) {
  DISTJAX_CHECK(p == nullptr, NotImplemented, "[cuda_free] cannot free ", nbytes,
                " bytes on cuda:", device, ": this build of DistJax has no CUDA backend");
}

}  // namespace cuda
}  // namespace distjax::tensor

namespace distjax::tensor::detail {

// No kernels: every op on a CUDA tensor says so (and no CUDA tensor can be made anyway).
const KernelTable& cuda_kernel_table() {
  static const KernelTable none{};
  return none;
}

}  // namespace distjax::tensor::detail

namespace distjax::tensor {

CudaMemoryStats cuda_memory_stats(int) {
  return {};
}

// Remembered, so that a program can set it everywhere; nothing multiplies on CUDA here.
namespace {
std::atomic<bool> tf32_allowed{false};
}
std::string cuda_attention_library() { return "this build has no CUDA backend"; }

CudnnAttentionCalls cuda_attention_cudnn_calls() { return {}; }
CudaGemmEpilogueCalls cuda_gemm_epilogue_calls() { return {}; }
CudaGemmTuning cuda_gemm_tuning() { return {}; }

void set_allow_tf32(bool allow) {
  tf32_allowed = allow;
}
bool allow_tf32() {
  return tf32_allowed;
}

}  // namespace distjax::tensor

namespace distjax::tensor {

void profile_ops_begin() {}
std::vector<OpTime> profile_ops_end() {
  return {};
}

namespace detail {
void cuda_profile_begin(const char*) {}
void cuda_profile_end() {}
}  // namespace detail

}  // namespace distjax::tensor
