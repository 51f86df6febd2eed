// CUDA dropout of the nn family (see table/nn.hpp's DropoutMask and cpu/nn.cpp): the keep
// mask is drawn on the device from the key's stream with the same Threefry-2x32 and the
// same Bernoulli draw as core/prng.cpp's random_bernoulli, so a key keeps the same
// elements on the CPU and the GPU, bit for bit.
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/nn.cuh"

namespace distjax::tensor::cuda::nn {
namespace {

__device__ __forceinline__ std::uint32_t rotl(std::uint32_t x, int r) {
  return (x << r) | (x >> (32 - r));
}

// Threefry-2x32 with 20 rounds of counter (c0, c1) under key (k0, k1): core/prng.cpp's
// threefry2x32, unrolled.
__device__ __forceinline__ uint2 threefry2x32(std::uint32_t k0, std::uint32_t k1, std::uint32_t c0,
                                              std::uint32_t c1) {
  constexpr int kRot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  const std::uint32_t ks[3] = {k0, k1, 0x1BD11BDAu ^ k0 ^ k1};
  std::uint32_t x0 = c0 + ks[0];
  std::uint32_t x1 = c1 + ks[1];
#pragma unroll
  for (int block = 0; block < 5; ++block) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotl(x1, kRot[(block % 2) * 4 + r]) ^ x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<std::uint32_t>(block + 1);
  }
  return make_uint2(x0, x1);
}

// random_bernoulli's draw of a stream word: open_unit(w) < keep, with open_unit's
// (w >> 8 + 0.5) 2^-24 rounded as on the CPU (round-to-nearest, no contraction), the top
// word's 1 taken down to the float below 1 as there.
__device__ __forceinline__ bool kept(std::uint32_t w, float keep) {
  const float u = fminf(__fmul_rn(__fadd_rn(__uint2float_rn(w >> 8), 0.5f), 1.0f / 16777216.0f),
                        0x1.fffffep-1f);
  return u < keep;
}

// Element `local` of run r (runs of `run` elements, element i of the whole at r run + local)
// takes word off_r + local of the key's stream, off_r = run_offsets[r] (0 without them).
// Item t = (r, k) draws stream block off_r / 2 + k (words 2 b and 2 b + 1) and writes the
// run's elements among those two words; per_run = run / 2 + 1 items cover any run's blocks.
// Bound: 8 bytes per element, and one Threefry block per two elements (integer-bound on an
// H100: about 100 integer operations per block); 1.8 TB/s at 6.3 M elements on an H200.
__global__ void dropout_kernel(const float* __restrict__ x, float* __restrict__ y, std::uint32_t k0,
                               std::uint32_t k1, float keep, float scale, std::int64_t run,
                               std::int64_t runs, std::int64_t per_run,
                               const std::int64_t* __restrict__ run_offsets) {
  const std::int64_t items = runs * per_run;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < items;
       t += stride) {
    const std::int64_t r = t / per_run, k = t - r * per_run;
    const std::int64_t off = run_offsets ? run_offsets[r] : 0;
    const std::int64_t b = off / 2 + k;
    const std::int64_t local0 = 2 * b - off;  // -1 for the first block of an odd offset
    if (local0 >= run) continue;
    const uint2 w = threefry2x32(k0, k1, static_cast<std::uint32_t>(std::uint64_t(b) >> 32),
                                 static_cast<std::uint32_t>(b));
    const std::int64_t i0 = r * run + local0;
    if (local0 >= 0) y[i0] = kept(w.x, keep) ? x[i0] * scale : 0.f;
    if (local0 + 1 < run) y[i0 + 1] = kept(w.y, keep) ? x[i0 + 1] * scale : 0.f;
  }
}

}  // namespace

void dropout(const float* x, float* y, std::int64_t n, const DropoutMask& mask,
             const std::int64_t* run_offsets) {
  if (n == 0) return;
  // Without offsets the whole is one run from word 0 (mask.run is then n).
  const std::int64_t run = run_offsets ? mask.run : n;
  DISTJAX_CHECK(run > 0 && n % run == 0, InvalidArgument, "[dropout] runs of ", run,
                " elements do not tile ", n, " elements");
  const std::int64_t runs = n / run, per_run = run / 2 + 1;
  const cudaStream_t st = thread_stream();
  dropout_kernel<<<grid_for(runs * per_run), kThreads, 0, st>>>(
      x, y, mask.key.words[0], mask.key.words[1], mask.keep, mask.scale, run, runs, per_run,
      run_offsets);
  DISTJAX_CUDA_LAUNCHED("dropout");
}

}  // namespace distjax::tensor::cuda::nn
