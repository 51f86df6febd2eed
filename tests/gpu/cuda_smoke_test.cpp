// The CUDA backend on a real GPU: device memory, a kernel launch, a copy back. Label "gpu".
// Without a GPU (or in a build without CUDA) the GPU tests skip with the runtime's reason;
// with DISTJAX_REQUIRE_GPU set (make test-gpu, scripts/gpu-machine.sh) they fail instead,
// so a GPU machine that lost its GPU cannot pass by skipping.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda/cuda_memory.hpp"
#include "gpu/gpu_test.hpp"
#ifdef DISTJAX_HAVE_CUDA
#include <cuda_runtime.h>

#include "distjax/tensor/cuda/fill.hpp"
#endif

namespace {

using namespace distjax;
using namespace distjax::tensor;


TEST(Cuda, BuiltWithCudaAsConfigured) {
#ifdef DISTJAX_HAVE_CUDA
  EXPECT_TRUE(built_with_cuda());
#else
  EXPECT_FALSE(built_with_cuda());
  EXPECT_EQ(cuda_device_count(), 0);
#endif
  // A reason is given exactly when there is no device.
  EXPECT_EQ(cuda_device_count() == 0, !cuda_unavailable_reason().empty())
      << "devices: " << cuda_device_count() << ", reason: \"" << cuda_unavailable_reason() << "\"";
}

// Runs on every machine: what runs bf16 attention is said without a GPU (cuDNN loads, and
// reports its version, where it is installed; a CPU machine with the toolkit has it), and
// DISTJAX_CUDA_ATTENTION is checked.
TEST(Cuda, SaysWhatRunsBf16Attention) {
  const std::string lib = cuda_attention_library();
  std::printf("bf16 attention: %s\n", lib.c_str());
  if (!built_with_cuda()) {
    EXPECT_EQ(lib, "this build has no CUDA backend");
    return;
  }
  EXPECT_TRUE(lib.rfind("cuDNN 9.", 0) == 0 || lib.find("cuDNN not loaded") != std::string::npos ||
              lib.find("no cuDNN attention") != std::string::npos)
      << lib;
  const char* old = std::getenv("DISTJAX_CUDA_ATTENTION");
  const std::string saved = old ? old : "";
  setenv("DISTJAX_CUDA_ATTENTION", "own", 1);
  const std::string own = cuda_attention_library();
  setenv("DISTJAX_CUDA_ATTENTION", "fastest", 1);
  std::string bad;
  try {
    cuda_attention_library();
  } catch (const ConfigError& e) {
    bad = e.what();
  }
  old ? setenv("DISTJAX_CUDA_ATTENTION", saved.c_str(), 1) : unsetenv("DISTJAX_CUDA_ATTENTION");
  if (lib.find("no cuDNN attention") != std::string::npos) return;  // built without it
  EXPECT_EQ(own, "turned off (DISTJAX_CUDA_ATTENTION=own)");
  EXPECT_NE(bad.find("auto, cudnn, own, f32"), std::string::npos) << bad;
}

// Runs on every machine: the device one past the last (cuda:0 where there is none) is
// refused with an error that names the op and that device.
TEST(Cuda, AllocOnAMissingDeviceNamesIt) {
  const int missing = cuda_device_count();
  const std::string device = "cuda:" + std::to_string(missing);
  try {
    void* p = cuda::cuda_alloc(64, missing);
    cuda::cuda_free(p, 64, missing);
    FAIL() << "cuda_alloc on " << device << " did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[cuda_alloc]"), std::string::npos) << what;
    EXPECT_NE(what.find(device), std::string::npos) << what;
  }
}

TEST(Cuda, FillsDeviceMemoryAndCopiesItBack) {
  SKIP_WITHOUT_GPU();
#ifdef DISTJAX_HAVE_CUDA
  // More elements than one pass of the grid (4096 blocks x 256 threads): the grid-stride
  // loop must come round; the first and last element stay outside the filled range.
  const std::int64_t n = (std::int64_t(1) << 21) + 3;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  auto* d = static_cast<float*>(cuda::cuda_alloc(bytes, 0));
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(cudaMemset(d, 0, bytes), cudaSuccess);
  cuda::cuda_fill_f32(d + 1, n - 2, 2.5f, nullptr);
  std::vector<float> host(static_cast<std::size_t>(n), -1.0f);
  ASSERT_EQ(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  cuda::cuda_free(d, bytes, 0);
  EXPECT_EQ(host.front(), 0.0f);
  EXPECT_EQ(host.back(), 0.0f);
  std::int64_t wrong = 0;
  for (std::int64_t i = 1; i < n - 1; ++i)
    wrong += host[static_cast<std::size_t>(i)] != 2.5f;
  EXPECT_EQ(wrong, 0) << "of " << n - 2 << " elements";
#endif
}

TEST(Cuda, FillRejectsANegativeCount) {
#ifdef DISTJAX_HAVE_CUDA
  // Checked before anything reaches the runtime, so this runs without a GPU too.
  EXPECT_THROW(cuda::cuda_fill_f32(nullptr, -1, 0.0f, nullptr), InvalidArgument);
  cuda::cuda_fill_f32(nullptr, 0, 0.0f, nullptr);  // nothing to do, no launch
#else
  GTEST_SKIP() << cuda_unavailable_reason();
#endif
}

}  // namespace
