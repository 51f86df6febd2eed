#include "distjax/tensor/detail/cast.hpp"

namespace distjax::tensor::detail {
namespace {

template <class F>
void visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(bf16{}); break;
    case DType::F16: f(f16{}); break;
    case DType::I32: f(std::int32_t{}); break;
    case DType::I64: f(std::int64_t{}); break;
    case DType::F64: f(double{}); break;  // unreached: no tensor holds f64
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

}  // namespace

void convert(const Tensor& src, Tensor& dst) {
  DISTJAX_CHECK(src.numel() == dst.numel(), InvalidArgument, "[astype] element counts differ");
  const std::int64_t n = src.numel();
  visit_dtype(src.dtype(), [&](auto from) {
    using From = decltype(from);
    visit_dtype(dst.dtype(), [&](auto to) {
      using To = decltype(to);
      const From* s = src.data<From>();
      To* d = dst.data<To>();
#pragma omp parallel for if (n > 262144)
      for (std::int64_t i = 0; i < n; ++i) d[i] = cast_one<To>(s[i]);
    });
  });
}

void fill(Tensor& t, double value) {
  const std::int64_t n = t.numel();
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = cast_one<T>(value);
    T* d = t.data<T>();
    for (std::int64_t i = 0; i < n; ++i) d[i] = v;
  });
}

double load_as_double(const Tensor& t, std::int64_t i) {
  double out = 0;
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    out = cast_one<double>(t.data<T>()[i]);
  });
  return out;
}

}  // namespace distjax::tensor::detail
