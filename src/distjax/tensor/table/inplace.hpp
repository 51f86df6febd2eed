// Kernel family: writes into existing tensors, for the parallel strategies: accumulation
// (gradient sums across micro-batches). Plain arguments only: pointers, sizes and the
// stream. Copies into views are the copy family's copy_2d; GEMMs into sub-blocks (the
// asynchronous tensor-parallel rings) the gemm family's gemm_f32_strided.
#pragma once

#include <cstdint>

#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::detail {

struct InplaceKernels {
  /// dst[i] += src[i] for i < n (f32; dst and src do not overlap).
  void (*add_f32)(float* dst, const float* src, std::int64_t n, Stream s);
};

}  // namespace distjax::tensor::detail
