// The CUDA backend's kernel table.
#include "distjax/tensor/cuda/kernels.hpp"

namespace distjax::tensor::detail {

const KernelTable& cuda_kernel_table() {
  // Every family: an op reaches the GPU through these (the CPU's table is cpu/table.cpp).
  static const KernelTable table{
      .copy = &cuda::copy_kernels,
      .update = &cuda::update_kernels,
      .gather = &cuda::gather_kernels,
      .elementwise = &cuda::elementwise_kernels,
      .reduce = &cuda::reduce_kernels,
      .shape = &cuda::shape_kernels,
      .nn = &cuda::nn_kernels,
      .attention = &cuda::attention_kernels,
      .gemm = &cuda::gemm_kernels,
      .inplace = &cuda::inplace_kernels,
      .shard = &cuda::shard_kernels,
      .memory = &cuda::memory_kernels,
      .moe = &cuda::moe_kernels,
  };
  return table;
}

}  // namespace distjax::tensor::detail
