// CPU kernels: the data pipeline's row gather.
#include <cstring>

#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

void gather_rows(const void* src, std::size_t row_bytes, const std::int64_t* rows, std::int64_t n,
                 void* dst) {
  const auto* s = static_cast<const std::uint8_t*>(src);
  auto* d = static_cast<std::uint8_t*>(dst);
  for (std::int64_t i = 0; i < n; ++i)
    std::memcpy(d + static_cast<std::size_t>(i) * row_bytes,
                s + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
}

}  // namespace

const GatherKernels gather_kernels{
    .gather_rows = gather_rows,
};

}  // namespace distjax::tensor::detail::cpu
