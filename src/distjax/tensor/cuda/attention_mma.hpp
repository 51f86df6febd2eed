// The attention family's tensor-core kernels (attention_mma.cu), for plans whose products
// may read bf16 operands (AttentionPlan::bf16_products). attention.cu's launchers call them
// where they serve the plan and fall back to its f32 kernels elsewhere.
#pragma once

#include <cuda_runtime.h>

#include "distjax/tensor/table/attention.hpp"

namespace distjax::tensor::cuda::attn_mma {

/// Whether these kernels serve plan a: bf16 products asked for, a head size of at most
/// 128, a GPU with bf16 tensor cores (compute capability 8.0 or later), and
/// DISTJAX_CUDA_ATTENTION not set to "f32" (which keeps every plan on the f32 kernels).
bool serves(const detail::AttentionPlan& a);

/// attention.cu's forward for a served plan: o and lse as AttentionKernels::forward.
/// vec: every row of q, k, v and o starts 16-byte aligned.
void forward(const detail::AttentionPlan& a, const float* q, const float* k, const float* v,
             float* o, float* lse, bool vec, cudaStream_t st);

/// attention.cu's backward for a served plan, after delta = rowsum(dO * O) per query row:
/// dq, dk, dv as AttentionKernels::backward. vec: as forward's, for q, k, v, go, dq, dk, dv.
void backward(const detail::AttentionPlan& a, const float* q, const float* k, const float* v,
              const float* lse, const float* go, const float* delta, float* dq, float* dk,
              float* dv, bool vec, cudaStream_t st);

}  // namespace distjax::tensor::cuda::attn_mma
