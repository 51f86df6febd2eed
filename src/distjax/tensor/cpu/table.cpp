// The CPU's kernel table (also the checked device's: its kernels are these, run while the
// table opens its memory).
#include "distjax/tensor/table/table.hpp"
#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail {

const KernelTable& cpu_kernel_table() {
  static const KernelTable table{
      .copy = &cpu::copy_kernels,
      .update = &cpu::update_kernels,
      .gather = &cpu::gather_kernels,
      .elementwise = &cpu::elementwise_kernels,
      .reduce = &cpu::reduce_kernels,
      .shape = &cpu::shape_kernels,
      .nn = &cpu::nn_kernels,
      .attention = &cpu::attention_kernels,
      .gemm = &cpu::gemm_kernels,
      .inplace = &cpu::inplace_kernels,
      .shard = &cpu::shard_kernels,
      .memory = &cpu::memory_kernels,
      .moe = &cpu::moe_kernels,
  };
  return table;
}

}  // namespace distjax::tensor::detail
