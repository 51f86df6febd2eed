// The CUDA backend's kernel families (defined in this folder, one file per family).
#pragma once

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::cuda {

extern const detail::CopyKernels copy_kernels;
extern const detail::OptimKernels optim_kernels;
extern const detail::DataKernels data_kernels;
extern const detail::ElementwiseKernels elementwise_kernels;
extern const detail::ReduceKernels reduce_kernels;
extern const detail::ShapeKernels shape_kernels;
extern const detail::NnKernels nn_kernels;
extern const detail::AttentionKernels attention_kernels;
extern const detail::GemmKernels gemm_kernels;
extern const detail::InplaceKernels inplace_kernels;
extern const detail::ParallelKernels parallel_kernels;
extern const detail::CommKernels comm_kernels;

}  // namespace distjax::tensor::cuda
