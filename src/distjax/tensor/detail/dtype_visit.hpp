// Calls a generic function with a value of the C++ type of a dtype, and converts one
// element between those types (bf16 and f16 through float).
#pragma once

#include <cstdint>
#include <type_traits>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

template <class F>
void visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(bf16{}); break;
    case DType::F16: f(f16{}); break;
    case DType::I32: f(std::int32_t{}); break;
    case DType::I64: f(std::int64_t{}); break;
    case DType::F64: f(double{}); break;
  }
}

template <class To, class From>
To cast_one(From v) {
  if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return cast_one<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

/// Element `i` of host memory `p` holding `dtype` values, as double.
inline double load_as_double(const void* p, DType dtype, std::int64_t i) {
  double out = 0;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    out = cast_one<double>(static_cast<const T*>(p)[i]);
  });
  return out;
}

}  // namespace distjax::tensor::detail
