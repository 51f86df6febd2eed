// Kernel family: writes into existing tensors, for the parallel strategies: accumulation
// (gradient sums across micro-batches) and GEMMs on sub-blocks of larger matrices (the
// asynchronous tensor-parallel rings). Plain arguments only: pointers, sizes, leading
// dimensions and the stream. Copies into views are the copy family's copy_2d.
#pragma once

#include <cstdint>

#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::detail {

struct InplaceKernels {
  /// dst[i] += src[i] for i < n (f32; dst and src do not overlap).
  void (*add_f32)(float* dst, const float* src, std::int64_t n, Stream s);
  /// C = alpha * op(A) op(B) + beta * C on row-major f32 blocks: op(A) is m x k, op(B)
  /// k x n, C m x n; lda, ldb, ldc are the elements between rows of the stored blocks (A
  /// stored k x m when trans_a, B n x k when trans_b).
  void (*gemm_f32)(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc, Stream s);
};

}  // namespace distjax::tensor::detail
