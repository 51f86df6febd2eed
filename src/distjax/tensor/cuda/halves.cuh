// bf16 and f16 on the device, converted bit for bit as the host's types of core/dtype.hpp
// (whose conversions are host-only). Included by .cu files only.
#pragma once

#include <cstdint>
#include <type_traits>

namespace distjax::tensor::cuda {

// bf16 and f16 storage on the device: the bits, converted by the functions below (the host
// types of core/dtype.hpp have host-only conversions).
struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

// f32 -> bf16, bit for bit as distjax::bf16(float): NaN stays a quiet NaN, else round to
// nearest even.
__device__ inline Bf16 bf16_from_f32(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<std::uint16_t>(u >> 16)};
}

// Four floats rounded to bf16 (bf16_from_f32) and stored at p[4j .. 4j + 3] as one 8-byte
// access (p 8-byte aligned).
__device__ inline void store_bf16x4(Bf16* p, std::int64_t j, float a, float b, float c, float d) {
  ushort4 u;
  u.x = bf16_from_f32(a).bits;
  u.y = bf16_from_f32(b).bits;
  u.z = bf16_from_f32(c).bits;
  u.w = bf16_from_f32(d).bits;
  reinterpret_cast<ushort4*>(p)[j] = u;
}

__device__ inline float f32_from_bf16(Bf16 h) {
  return __uint_as_float(static_cast<std::uint32_t>(h.bits) << 16);
}

// f32 -> f16, bit for bit as detail::f16_bits_from_f32 (the rounding of a _Float16
// conversion): nearest even, overflow to inf, NaN a quiet NaN keeping the top of its payload.
__device__ inline F16 f16_from_f32(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return {static_cast<std::uint16_t>(
        sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u | ((abs >> 13) & 0x3ffu) : 0u))};
  if (abs >= 0x47800000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};
  std::uint32_t h, rem, half;
  if (abs < 0x38800000u) {  // a subnormal half, in units of 2^-24
    if (abs < 0x33000000u) return {static_cast<std::uint16_t>(sign)};
    const std::uint32_t shift = 126u - (abs >> 23);  // 14..24
    const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    h = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {
    h = (abs - 0x38000000u) >> 13;
    rem = abs & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return {static_cast<std::uint16_t>(sign | h)};
}

// f16 -> f32 (exact); a NaN comes back quiet, as the CPU's _Float16 conversion returns it.
__device__ inline float f32_from_f16(F16 v) {
  const std::uint32_t h = v.bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  std::uint32_t x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: shift the leading one to bit 10
    const int s = __clz(m) - 21;
    x = sign | (static_cast<std::uint32_t>(113 - s) << 23) | (((m << s) & 0x3ffu) << 13);
  }
  return __uint_as_float(x);
}

template <class T>
constexpr bool kHalf = std::is_same_v<T, Bf16> || std::is_same_v<T, F16>;

template <class T>
__device__ inline float f32_from_half(T v) {
  if constexpr (std::is_same_v<T, Bf16>)
    return f32_from_bf16(v);
  else
    return f32_from_f16(v);
}

template <class T>
__device__ inline T half_from_f32(float f) {
  if constexpr (std::is_same_v<T, Bf16>)
    return bf16_from_f32(f);
  else
    return f16_from_f32(f);
}
}  // namespace distjax::tensor::cuda
