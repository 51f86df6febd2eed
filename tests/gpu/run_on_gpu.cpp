// run_on_gpu <test binary> [args...]: runs a test program with every simulated device on
// the GPU (DISTJAX_DEVICE=cuda), for the "gpu" reruns of the parity tests. Where there is no
// usable GPU it prints the runtime's reason and exits 77, which ctest reports as a skip
// (SKIP_RETURN_CODE), or fails under DISTJAX_REQUIRE_GPU=1 (make test-gpu), so a GPU
// machine that lost its GPU cannot pass by skipping.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "distjax/tensor/cuda.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: run_on_gpu <test binary> [args...]\n");
    return 2;
  }
  if (distjax::tensor::cuda_device_count() == 0) {
    const std::string why = distjax::tensor::cuda_unavailable_reason();
    if (std::getenv("DISTJAX_REQUIRE_GPU") != nullptr) {
      std::fprintf(stderr, "no usable GPU, and DISTJAX_REQUIRE_GPU is set: %s\n", why.c_str());
      return 1;
    }
    std::printf("skipped: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  setenv("DISTJAX_DEVICE", "cuda", /*overwrite=*/1);
  execv(argv[1], argv + 1);
  std::fprintf(stderr, "run_on_gpu: cannot run %s: %s\n", argv[1], std::strerror(errno));
  return 2;
}
