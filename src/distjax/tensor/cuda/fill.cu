// Fill kernels of the CUDA backend (see fill.hpp).
#include "distjax/tensor/cuda/fill.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda_runtime.hpp"

namespace distjax::tensor::cuda {
namespace {

// Grid-stride loop: any n with a bounded grid. Bound: 4 bytes written per element (a store
// stream); not yet measured on a card.
__global__ void fill_f32_kernel(float* p, std::int64_t n, float value) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

constexpr int kBlock = 256;
// Enough blocks to fill an H100 several times over (132 SMs x 8 resident blocks of 256
// threads = 1056), few enough that each thread loops over several elements of a large fill.
constexpr std::int64_t kMaxBlocks = 4096;

}  // namespace

void cuda_fill_f32(float* p, std::int64_t n, float value, cudaStream_t stream) {
  DISTJAX_CHECK(n >= 0, InvalidArgument, "[cuda_fill_f32] expected n >= 0, got ", n);
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, (n + kBlock - 1) / kBlock));
  fill_f32_kernel<<<blocks, kBlock, 0, stream>>>(p, n, value);
  DISTJAX_CUDA_CHECK(cudaGetLastError(), "cuda_fill_f32");
}

}  // namespace distjax::tensor::cuda
