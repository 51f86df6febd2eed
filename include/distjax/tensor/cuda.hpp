// What this build and this machine offer of CUDA: whether the library was compiled with its
// CUDA backend, how many GPUs the runtime sees, and why there are none; the device memory
// the backend holds; the precision of f32 matrix products; what runs bf16 attention.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distjax::tensor {

/// True when this build of DistJax has its CUDA backend (configured with
/// DISTJAX_WITH_CUDA=AUTO where nvcc was found, or =ON). Says nothing about the machine:
/// a build with CUDA runs on machines without a GPU, where cuda_device_count() is 0.
bool built_with_cuda();

/// The number of CUDA devices the runtime sees (honours CUDA_VISIBLE_DEVICES). 0, never an
/// error, when the build has no CUDA, the machine has no driver or no GPU: then
/// cuda_unavailable_reason() says which.
int cuda_device_count();

/// Why cuda_device_count() is 0, e.g. "this build has no CUDA (...)" or "cudaGetDeviceCount
/// failed: CUDA driver version is insufficient for CUDA runtime version
/// (cudaErrorInsufficientDriver)". Empty when there is a device.
std::string cuda_unavailable_reason();

/// Device memory of the CUDA backend on one device, in bytes: `reserved` is what its
/// stream-ordered pool holds from the driver (freed blocks stay there for reuse: no
/// cudaMalloc/cudaFree per step), `reserved_peak` the most it held. What tensors use is
/// live_bytes(DeviceKind::CUDA) / peak_bytes(DeviceKind::CUDA) (tensor.hpp). All zero
/// without CUDA.
struct CudaMemoryStats {
  std::int64_t reserved = 0;
  std::int64_t reserved_peak = 0;
};
CudaMemoryStats cuda_memory_stats(int device = 0);

/// Whether f32 matrix products on CUDA may use TF32 (the tensor cores' 10-bit mantissa,
/// about 1e-3 relative error, several times faster). Off unless set here or by the
/// environment variable DISTJAX_ALLOW_TF32=1: f32 products are full f32 by default, as in
/// PyTorch. bf16 products are unaffected.
void set_allow_tf32(bool allow);
bool allow_tf32();

/// What runs the bf16 policy's attention on CUDA: "cuDNN 9.x.y through the cuDNN frontend
/// 1.32.0" where cuDNN's fused attention is built in and loads, else why the project's own
/// kernels run instead (not built, not loaded, DISTJAX_CUDA_ATTENTION=own). A problem cuDNN
/// refuses (head size not a multiple of 8 or over 128, a causal mask with T != S) runs the
/// own kernels too. DISTJAX_CUDA_ATTENTION: auto (default), cudnn (cuDNN or an error), own
/// (the own bf16 kernels), f32 (the own f32 kernels).
std::string cuda_attention_library();
/// How many bf16 attention forwards and backwards cuDNN ran in this process (0 without it).
struct CudnnAttentionCalls {
  std::int64_t forward = 0, backward = 0;
};
CudnnAttentionCalls cuda_attention_cudnn_calls();

/// How many GEMMs with an epilogue beyond an f32 D and a bias (linear's GELU, a bf16 or f16
/// output: tensor::LinearEpilogue; gelu_mlp's backward GELU derivative and bias gradient; a
/// 16-bit linear's bias gradient in its dW product) ran in this process on CUDA: `fused` in
/// cuBLASLt's own epilogue, `unfused` as an f32 sum and the elementwise kernels because cuBLASLt
/// offered no algorithm or refused the call (0 without CUDA).
struct CudaGemmEpilogueCalls {
  std::int64_t fused = 0, unfused = 0;
};
CudaGemmEpilogueCalls cuda_gemm_epilogue_calls();

/// With DISTJAX_CUDA_GEMM_TUNE=1 (off by default: the choice follows timings, so two runs
/// may round differently), each GEMM problem times up to 8 of cuBLASLt's heuristic
/// algorithms on its first call, per thread, and keeps the fastest. What that found in this
/// process: the problems tuned, those whose fastest was not the heuristic's first, and the
/// device time saved by one call of each of those (ms, summed). Zeros otherwise.
struct CudaGemmTuning {
  std::int64_t problems = 0, changed = 0;
  double saved_ms_per_call = 0;
};
CudaGemmTuning cuda_gemm_tuning();

/// Device time per op on CUDA: between profile_ops_begin() and profile_ops_end(), every op
/// dispatched to a CUDA device records a pair of CUDA events around its kernels (on the
/// calling thread's stream); profile_ops_end() waits for them and returns each op's total
/// (an op that calls another counts the inner one's time in both), largest first. The
/// events cost a few microseconds per op: profile apart from timed runs. Empty without CUDA.
struct OpTime {
  std::string op;
  double ms = 0;
  std::int64_t calls = 0;
};
void profile_ops_begin();
std::vector<OpTime> profile_ops_end();

}  // namespace distjax::tensor
