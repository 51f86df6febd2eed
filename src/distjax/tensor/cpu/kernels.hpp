// The CPU's kernel families (defined in this folder, one file per family).
#pragma once

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail::cpu {

extern const CopyKernels copy_kernels;
extern const OptimKernels optim_kernels;
extern const DataKernels data_kernels;
extern const ElementwiseKernels elementwise_kernels;
extern const ReduceKernels reduce_kernels;
extern const ShapeKernels shape_kernels;
extern const NnKernels nn_kernels;
extern const AttentionKernels attention_kernels;
extern const GemmKernels gemm_kernels;
extern const InplaceKernels inplace_kernels;
extern const ParallelKernels parallel_kernels;

}  // namespace distjax::tensor::detail::cpu
