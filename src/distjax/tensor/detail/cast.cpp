#include "distjax/tensor/detail/cast.hpp"

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

void convert(const Tensor& src, Tensor& dst) {
  DISTJAX_CHECK(src.numel() == dst.numel(), InvalidArgument, "[astype] element counts differ");
  Dispatch k("astype", &KernelTable::copy, {&src, &dst});
  k->convert(src.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), src.numel(), Stream{});
}

void fill(Tensor& t, double value) {
  Dispatch k("fill", &KernelTable::copy, {&t});
  k->fill(t.raw_data(), t.dtype(), t.numel(), value);
}

}  // namespace distjax::tensor::detail
