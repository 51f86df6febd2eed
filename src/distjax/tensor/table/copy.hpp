// Kernel family: fills, dtype conversion and copies (within a device, and to and from the
// host). Plain arguments only: pointers, sizes and dtypes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/core/dtype.hpp"
#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::detail {

struct CopyKernels {
  /// dst[i] = value converted to `dtype`, for i < n.
  void (*fill)(void* dst, DType dtype, std::int64_t n, double value);
  /// dst[i] = src[i] converted from `from` to `to`, for i < n, queued on stream s (the one
  /// entry a caller may give a stream of its own: a communication backend converting on its
  /// stream).
  void (*convert)(const void* src, DType from, void* dst, DType to, std::int64_t n, Stream s);
  /// `rows` runs of `row_bytes` bytes from src (runs `src_stride` bytes apart) to dst (runs
  /// `dst_stride` bytes apart), on one device: contiguous copies (rows = 1), slices,
  /// concatenation and the packing of buckets and shards.
  void (*copy_2d)(const void* src, std::size_t src_stride, void* dst, std::size_t dst_stride,
                  std::size_t row_bytes, std::int64_t rows);
  /// nbytes from device memory to host memory, and back. to_host returns with host_dst
  /// written. from_host returns with host_src reusable; the device's copy is then ready in
  /// the stream's order, as a kernel's output is (a GPU stages it through page-locked
  /// memory and does not wait for the stream).
  void (*to_host)(const void* src, void* host_dst, std::size_t nbytes);
  void (*from_host)(const void* host_src, void* dst, std::size_t nbytes);
};

}  // namespace distjax::tensor::detail
