// The CUDA op harness's shared parts (cuda_ops_test.cpp, cuda_gemm_ops_test.cpp): each op,
// forward and backward, on the GPU against the CPU on the same fresh random inputs. Every
// new block of device memory is poisoned (DISTJAX_CUDA_POISON: 0xFF bytes, NaN in f32), so
// an output element a kernel leaves unwritten shows as a NaN and fails.
//
// Tolerances (relative, ||gpu - cpu|| / ||cpu|| over each output and gradient):
//   kF32 = 1e-5: f32 kernels (the summation order may differ from the CPU's);
//   kTf32 = 1e-3: f32 products with TF32 allowed;
//   kBf16 = 1e-2: bf16 operands;
//   kF16 = 1e-3: f16 operands.
// Integer outputs, masks, copies and ids must be equal. Without a GPU every test skips,
// saying why (fails under DISTJAX_REQUIRE_GPU=1). Included by one test file per program.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "distjax/distjax.hpp"
#include "gpu/gpu_test.hpp"
#include "tensor/checked_parity.hpp"

namespace distjax::testing::gpu_ops {

using namespace distjax::tensor;
using distjax::testing::host_uniform;
using distjax::testing::run_on;
using V = std::vector<Tensor>;
using Fn = std::function<Tensor(const V&)>;

constexpr double kF32 = 1e-5;
constexpr double kTf32 = 1e-3;
constexpr double kBf16 = 1e-2;
// f16 operands: both devices round to f16 alike and multiply exactly; the sums are f32 in
// another order, and the tensor cores' f32 accumulation does not round each add as IEEE
// adds do: 1e-3 leaves room for that, well below f16's own step (2^-11 ~ 5e-4 relative per
// element, which a bug in the operands' conversion would exceed over a whole output).
constexpr double kF16 = 1e-3;

// Poison every CUDA allocation of this process (read at the first one).
inline const bool poisoned = (setenv("DISTJAX_CUDA_POISON", "1", 1), true);

inline const Device kGpu{DeviceKind::CUDA, 0};

// A fresh seed per call: each check draws new inputs.
inline std::uint64_t fresh() {
  static std::uint64_t next = 1000;
  return next++;
}

inline Tensor uniform(const Shape& shape) {
  return host_uniform(shape, fresh());
}
// Values in [lo, hi).
inline Tensor uniform(const Shape& shape, float lo, float hi) {
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  random_uniform(Key::from_seed(fresh()), v.data(), numel(shape), lo, hi);
  return Tensor::from_vector(v, shape, Device::cpu());
}

// got (from the GPU) against want (the CPU's): same shape and dtype; floating outputs within
// rtol (norm-wise) and no NaN where the CPU has none; others equal.
inline ::testing::AssertionResult close(const Tensor& got, const Tensor& want, double rtol) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << got.str(0) << " vs " << want.str(0);
  const bool floating =
      want.dtype() == DType::F32 || want.dtype() == DType::BF16 || want.dtype() == DType::F16;
  if (!floating) return distjax::testing::same_bits(got, want);
  const std::vector<float> g = astype(got, DType::F32).to_vector<float>();
  const std::vector<float> w = astype(want, DType::F32).to_vector<float>();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i]) || std::isinf(g[i]) != std::isinf(w[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << w.size() << ": " << g[i] << " vs the CPU's " << w[i]
             << " (NaN: unwritten or a bad value)";
    if (!std::isfinite(w[i])) {
      if (g[i] != w[i]) return ::testing::AssertionFailure() << "element " << i << " differs";
      continue;
    }
    diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    norm += double(w[i]) * w[i];
  }
  const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  if (rel <= rtol) return ::testing::AssertionSuccess();
  std::size_t worst = 0;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (std::fabs(g[i] - w[i]) > std::fabs(g[worst] - w[worst])) worst = i;
  return ::testing::AssertionFailure()
         << "relative error " << rel << " > " << rtol << "; worst element " << worst << ": "
         << g[worst] << " vs the CPU's " << w[worst];
}

// fn forward, and backward into the inputs marked in `diff`, on the GPU and on the CPU.
inline void expect_close(const std::string& what, const Fn& fn, const V& inputs,
                         const std::vector<bool>& diff, double rtol = kF32) {
  SCOPED_TRACE(what);
  Tensor ct;
  {
    DeviceScope cpu(Device::cpu());
    NoGradGuard off;
    const Tensor y = fn(inputs);
    if (y.dtype() == DType::F32) ct = uniform(y.shape());
  }
  std::vector<bool> d = diff;
  if (!ct.defined()) d.assign(d.size(), false);  // no gradient through a non-f32 output
  const V want = run_on(Device::cpu(), fn, inputs, d, ct);
  const V got = run_on(kGpu, fn, inputs, d, ct);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(close(got[i], want[i], rtol))
        << (i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1));
}

}  // namespace distjax::testing::gpu_ops
