// The CPU's kernel families (defined in this folder, one file per family).
#pragma once

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail::cpu {

extern const CopyKernels copy_kernels;
extern const UpdateKernels update_kernels;
extern const GatherKernels gather_kernels;
extern const ElementwiseKernels elementwise_kernels;
extern const ReduceKernels reduce_kernels;
extern const ShapeKernels shape_kernels;
extern const NnKernels nn_kernels;
extern const AttentionKernels attention_kernels;
/// Whether the CPU's attention family serves bf16 plans through its bf16-operand entries
/// (widening to f32 and rounding o, dq, dk, dv to bf16), as CUDA's cuDNN path does; off by
/// default. For the tests of the ops' bf16 path.
void set_serves_bf16_attention(bool on);
extern const GemmKernels gemm_kernels;
extern const InplaceKernels inplace_kernels;
extern const ShardKernels shard_kernels;
extern const MemoryKernels memory_kernels;
extern const MoeKernels moe_kernels;

/// The CPU's reduce_ranks (memory_kernels.reduce_ranks: AVX-512 for f32 where built), and the
/// plain loop it must match bit for bit (every dtype), for its tests.
void reduce_ranks(void* const* dsts, int m, const void* const* srcs, int k, std::int64_t n,
                  DType dtype, RankReduce op, int divisor);
void reduce_ranks_generic(void* dst, const void* const* srcs, int k, std::int64_t n, DType dtype,
                          RankReduce op, int divisor);

}  // namespace distjax::tensor::detail::cpu
