// The CUDA backend's kernel families (defined in this folder, one file per family).
#pragma once

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::cuda {

extern const detail::CopyKernels copy_kernels;
extern const detail::UpdateKernels update_kernels;
extern const detail::GatherKernels gather_kernels;
extern const detail::ElementwiseKernels elementwise_kernels;
extern const detail::ReduceKernels reduce_kernels;
extern const detail::ShapeKernels shape_kernels;
extern const detail::NnKernels nn_kernels;
extern const detail::AttentionKernels attention_kernels;
extern const detail::GemmKernels gemm_kernels;
extern const detail::InplaceKernels inplace_kernels;
extern const detail::ShardKernels shard_kernels;
extern const detail::MemoryKernels memory_kernels;
extern const detail::MoeKernels moe_kernels;

/// The GEMM family's epilogue backward (gemm_epilogue.cu), for gemm.cpp's table.
void epilogue_backward(const void* g, DType g_dtype, const void* aux, DType aux_dtype, void* out,
                       DType out_dtype, float* bias_grad, std::int64_t rows, std::int64_t n);

}  // namespace distjax::tensor::cuda
