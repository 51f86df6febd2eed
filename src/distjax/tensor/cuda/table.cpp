// The CUDA backend's kernel table.
#include "distjax/tensor/cuda/kernels.hpp"

namespace distjax::tensor::detail {

const KernelTable& cuda_kernel_table() {
  // Each family's line is added with its file; a family without one leaves its ops
  // refusing the device (NotImplemented naming the op and the device).
  static const KernelTable table{
      .copy = &cuda::copy_kernels,
      .data = &cuda::data_kernels,
      .elementwise = &cuda::elementwise_kernels,
      .shape = &cuda::shape_kernels,
      .nn = &cuda::nn_kernels,
      .attention = &cuda::attention_kernels,
      .gemm = &cuda::gemm_kernels,
      .inplace = &cuda::inplace_kernels,
  };
  return table;
}

}  // namespace distjax::tensor::detail
