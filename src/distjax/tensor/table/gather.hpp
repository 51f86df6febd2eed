// Kernel family: rows gathered by index (a batch from a dataset's rows). Plain
// arguments only: pointers, sizes and the stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/tensor/table/stream.hpp"

namespace distjax::tensor::detail {

struct GatherKernels {
  /// Row i of dst (row_bytes bytes) = row rows[i] of src, for i < n; `rows` is device
  /// memory holding valid row indices.
  void (*gather_rows)(const void* src, std::size_t row_bytes, const std::int64_t* rows,
                      std::int64_t n, void* dst, Stream s);
};

}  // namespace distjax::tensor::detail
