// Kernel family: rows gathered by index (a batch from a dataset's rows). Plain
// arguments only: pointers and sizes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distjax::tensor::detail {

struct GatherKernels {
  /// Row i of dst (row_bytes bytes) = row rows[i] of src, for i < n; `rows` is device
  /// memory holding valid row indices.
  void (*gather_rows)(const void* src, std::size_t row_bytes, const std::int64_t* rows,
                      std::int64_t n, void* dst);
};

}  // namespace distjax::tensor::detail
