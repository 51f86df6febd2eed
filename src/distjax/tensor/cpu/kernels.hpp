// The CPU's kernel families (defined in this folder, one file per family).
#pragma once

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail::cpu {

extern const CopyKernels copy_kernels;
extern const InplaceKernels inplace_kernels;
extern const ParallelKernels parallel_kernels;

}  // namespace distjax::tensor::detail::cpu
