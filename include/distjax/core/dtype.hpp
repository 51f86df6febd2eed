// Element types: f32, bf16 and f16 (storage types, computed in f32 on CPU), i32, i64 for
// tensors; f64 only for values that travel through comm (timings, statistics).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace distjax {

/// Element type of a Tensor or of a comm::Buffer. F64 is a comm dtype only: a Tensor
/// never holds it (Tensor::empty refuses it), so tensor kernels need not handle it.
enum class DType : std::uint8_t { F32, BF16, F16, I32, I64, F64 };

/// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::F64:
      return 8;
  }
  return 0;
}
/// A floating tensor dtype (F64, not a tensor dtype, is left out).
constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}
/// "f32", "bf16", "f16", "i32", "i64", "f64".
const char* dtype_name(DType t);
/// Inverse of dtype_name over the tensor dtypes (not "f64"); throws InvalidArgument for
/// any other name.
DType dtype_from_name(const std::string& name);

/// bfloat16 storage: the upper 16 bits of an IEEE f32, rounded to nearest even.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<std::uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// IEEE half-precision storage, converted through the compiler's _Float16.
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) {
    _Float16 h = static_cast<_Float16>(f);
    std::memcpy(&bits, &h, 2);
  }
  explicit operator float() const {
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return static_cast<float>(h);
  }
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}

}  // namespace distjax
