// The CUDA backend's kernel table.
#include "distjax/tensor/cuda/kernels.hpp"

namespace distjax::tensor::detail {

const KernelTable& cuda_kernel_table() {
  // Each family's line is added with its file; a family without one leaves its ops
  // refusing the device (NotImplemented naming the op and the device).
  static const KernelTable table{
      .optim = &cuda::optim_kernels,
      .reduce = &cuda::reduce_kernels,
      .parallel = &cuda::parallel_kernels,
  };
  return table;
}

}  // namespace distjax::tensor::detail
