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

namespace detail {

/// f32 -> IEEE half bits, rounding to nearest even (overflow to inf, NaN stays a quiet NaN
/// with the top of its payload): what a _Float16 conversion does, for compilers without
/// _Float16 (clang before 15 on x86 without AVX512-FP16).
inline std::uint16_t f16_bits_from_f32(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf, NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u |
                                      (abs > 0x7f800000u ? 0x0200u | ((abs >> 13) & 0x3ffu) : 0u));
  if (abs >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  std::uint32_t h, rem, half;
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below 2^-25: zero
    const std::uint32_t shift = 126u - (abs >> 23);                  // 14..24
    const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    h = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {  // rebias the exponent (127 -> 15); a carry out of the mantissa is still right
    h = (abs - 0x38000000u) >> 13;
    rem = abs & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// IEEE half bits -> f32 (exact).
inline float f32_from_f16_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: normalise
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace detail

/// IEEE half-precision storage, converted through the compiler's _Float16 where it has one
/// (g++ 12 and later, clang 15 and later; __FLT16_MAX__ says so), else in software with the
/// same rounding (detail::f16_bits_from_f32).
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
#ifdef __FLT16_MAX__
  explicit f16(float f) {
    _Float16 h = static_cast<_Float16>(f);
    std::memcpy(&bits, &h, 2);
  }
  explicit operator float() const {
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return static_cast<float>(h);
  }
#else
  explicit f16(float f) : bits(detail::f16_bits_from_f32(f)) {}
  explicit operator float() const {
    return detail::f32_from_f16_bits(bits);
  }
#endif
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
