// CPU kernels: fills, dtype conversion and copies.
#include <cstring>
#include <type_traits>

#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/detail/dtype_visit.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

void fill(void* dst, DType dtype, std::int64_t n, double value) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = cast_one<T>(value);
    T* d = static_cast<T*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = v;
  });
}

void convert(const void* src, DType from, void* dst, DType to, std::int64_t n, Stream) {
  visit_dtype(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* s = static_cast<const From*>(src);
      To* d = static_cast<To*>(dst);
#pragma omp parallel for if (n > 262144)
      for (std::int64_t i = 0; i < n; ++i) d[i] = cast_one<To>(s[i]);
    });
  });
}

void copy_2d(const void* src, std::size_t src_stride, void* dst, std::size_t dst_stride,
             std::size_t row_bytes, std::int64_t rows) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  if (rows == 1 || (src_stride == row_bytes && dst_stride == row_bytes)) {
    if (row_bytes * static_cast<std::size_t>(rows) > 0)
      std::memcpy(d, s, row_bytes * static_cast<std::size_t>(rows));
    return;
  }
#pragma omp parallel for if (row_bytes * static_cast<std::size_t>(rows) > (std::size_t(1) << 20))
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(d + r * dst_stride, s + r * src_stride, row_bytes);
}

void copy_bytes(const void* src, void* dst, std::size_t nbytes) {
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

}  // namespace

const CopyKernels copy_kernels{
    .fill = fill,
    .convert = convert,
    .copy_2d = copy_2d,
    .to_host = copy_bytes,
    .from_host = copy_bytes,
};

}  // namespace distjax::tensor::detail::cpu
