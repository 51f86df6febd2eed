// A register-blocked AVX-512 GEMM for the small products inside the CPU's fused kernels
// (attention's per-head blocks: tens to a few hundred rows and columns), where a
// library call's setup costs as much as the arithmetic. Host pointers: a helper of
// kernels in tensor/cpu/, not a kernel of the table.
#pragma once

#include <cstdint>

namespace distjax::tensor::detail::cpu {

/// C (m x n) = alpha * A B + beta * C with A(i, p) = a[i * a_rs + p * a_cs] (so A or its
/// transpose, any strides), B (k x n) row-major with leading dimension ldb, C row-major
/// with ldc. beta is 0 (C is not read) or 1. Single-threaded.
void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                std::int64_t a_rs, std::int64_t a_cs, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc);

/// dst (cols x rows, leading dimension ldd) = src (rows x cols, leading dimension lds)^T.
void transpose(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t lds,
               float* dst, std::int64_t ldd);

}  // namespace distjax::tensor::detail::cpu
