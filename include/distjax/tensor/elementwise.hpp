// Elementwise ops: broadcasting binary arithmetic, scalar ops, unary activations,
// selection and casts. Each op is differentiable; its backward sits next to its
// forward in src/distjax/tensor/elementwise.cpp.
#pragma once

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

// Binary ops broadcast NumPy-style; inputs must share a floating dtype (f32).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise maximum; the gradient goes to `a` where a >= b, else to `b`.
Tensor maximum(const Tensor& a, const Tensor& b);

Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);
/// x ** p for a constant exponent p.
Tensor pow_scalar(const Tensor& x, double p);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
/// GELU; `approximate` selects the tanh form (JAX's default), else the erf form.
///
/// `out`: the output's dtype, F32 or the dtype a matmul will read it in (the bf16 policy's
/// MLP): the cast of the f32 output, the same bits, written in one pass where the device
/// can (bf16). The backward keeps x only (GELU's derivative reads x), whatever `out`.
Tensor gelu(const Tensor& x, bool approximate = true, DType out = DType::F32);
/// x * sigmoid(x).
Tensor silu(const Tensor& x);

/// where(cond, a, b): a where cond != 0, else b. cond is f32 or i32, broadcasts against
/// a and b; no gradient flows to cond.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

/// Converts to another dtype (f32 <-> bf16/f16 round to nearest even; ints truncate).
/// Differentiable between floating types: the cotangent is cast back.
Tensor astype(const Tensor& x, DType dtype);

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}
inline Tensor operator+(const Tensor& a, double s) {
  return add_scalar(a, s);
}
inline Tensor operator-(const Tensor& a, double s) {
  return add_scalar(a, -s);
}
inline Tensor operator*(const Tensor& a, double s) {
  return mul_scalar(a, s);
}
inline Tensor operator*(double s, const Tensor& a) {
  return mul_scalar(a, s);
}
inline Tensor operator/(const Tensor& a, double s) {
  return mul_scalar(a, 1.0 / s);
}

}  // namespace distjax::tensor
