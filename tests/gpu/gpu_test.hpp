// What every test of tests/gpu/ shares: SKIP_WITHOUT_GPU(), which skips a test with the
// runtime's reason where there is no usable GPU, or fails it under DISTJAX_REQUIRE_GPU=1
// (make test-gpu, scripts/gpu-machine.sh), so a GPU machine that lost its GPU cannot pass
// by skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>

#include "distjax/tensor/cuda.hpp"

#define SKIP_WITHOUT_GPU()                                                           \
  do {                                                                               \
    if (::distjax::tensor::cuda_device_count() == 0) {                               \
      if (std::getenv("DISTJAX_REQUIRE_GPU") != nullptr)                             \
        FAIL() << "no usable GPU, and DISTJAX_REQUIRE_GPU is set: "                  \
               << ::distjax::tensor::cuda_unavailable_reason();                      \
      GTEST_SKIP() << ::distjax::tensor::cuda_unavailable_reason();                  \
    }                                                                                \
  } while (0)
