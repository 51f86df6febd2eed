// The CUDA attention family's bf16 entries (AttentionKernels::serves_bf16, forward_bf16,
// backward_bf16): cuDNN's fused scaled-dot-product attention (flash attention, no (T, S)
// matrix) through the cuDNN frontend's graph API, cuDNN loaded at run time (dlopen of
// libcudnn.so.9), so a machine without cuDNN runs the project's own kernels instead.
//
// Which attention runs for a bf16 plan, by DISTJAX_CUDA_ATTENTION:
//   unset or "auto": cuDNN where it loads and builds a plan for the problem, else the own
//                    kernels (attention.cu, attention_mma.cu), saying why once on stderr;
//   "cudnn":         cuDNN, or an error saying why not (for benchmarks and tests);
//   "own":           the own kernels (bf16 tensor-core ones, attention_mma.cu);
//   "f32":           the own f32 kernels (attention_mma.cu's switch).
// The library is looked for at $DISTJAX_CUDNN_LIBRARY, then as libcudnn.so.9 (the loader's
// search path, then the CUDA toolkit's lib64 this build found).
#pragma once

#include <cstdint>
#include <string>

#include "distjax/tensor/table/attention.hpp"

namespace distjax::tensor::cuda::cudnn_attention {

/// Whether cuDNN's SDPA runs plan `a` (bf16 products, head size a multiple of 8 up to 128,
/// a causal mask only with T == S, row strides of 8 elements); builds and caches its
/// forward and backward graphs on the first ask. Throws under DISTJAX_CUDA_ATTENTION=cudnn
/// where the answer is no.
bool serves(const detail::AttentionPlan& a);

void forward(const detail::AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v, bf16* o,
             float* lse);
void backward(const detail::AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v,
              const bf16* o, const float* lse, const bf16* go, bf16* dq, bf16* dk, bf16* dv);

/// "cuDNN 9.x.y through cuDNN frontend 1.32.0 (backward deterministic)", or why cuDNN's
/// attention does not run here (not built, not loaded, turned off).
std::string status();

/// How many forward and backward calls cuDNN ran in this process.
struct Calls {
  std::int64_t forward = 0, backward = 0;
};
Calls calls();

}  // namespace distjax::tensor::cuda::cudnn_attention
