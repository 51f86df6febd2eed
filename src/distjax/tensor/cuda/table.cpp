// The CUDA backend's kernel table.
#include "distjax/tensor/cuda/kernels.hpp"

namespace distjax::tensor::detail {

const KernelTable& cuda_kernel_table() {
  // Each family's line is added with its file; a family without one leaves its ops
  // refusing the device (NotImplemented naming the op and the device).
  static const KernelTable table{
      .nn = &cuda::nn_kernels,
      .attention = &cuda::attention_kernels,
      .gemm = &cuda::gemm_kernels,
  };
  return table;
}

}  // namespace distjax::tensor::detail
