// Kernel family: elementwise maps of f32 tensors (unary ops by op code with their
// derivatives, broadcasting binary ops, selection). Plain arguments only.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"
#include "distjax/tensor/table/broadcast.hpp"

namespace distjax::tensor::detail {

/// Unary maps. `c` is the scalar of AddScalar and MulScalar and the exponent of Pow;
/// Identity, Square, Cube, Sqrt and Reciprocal are pow_scalar's common exponents.
/// NonZero is 1 where x != 0, else 0.
enum class UnaryOp {
  AddScalar,
  MulScalar,
  Identity,
  Square,
  Cube,
  Sqrt,
  Reciprocal,
  Pow,
  Exp,
  Log,
  Rsqrt,
  Tanh,
  Sigmoid,
  Relu,
  GeluTanh,
  GeluErf,
  Silu,
  NonZero,
};

/// Binary maps; GreaterEqual is 1 where a >= b, else 0 (maximum's mask).
enum class BinaryOp { Add, Sub, Mul, Div, Maximum, GreaterEqual };

struct ElementwiseKernels {
  /// out[i] = op(x[i]) for i < n (f32).
  void (*unary)(UnaryOp op, const float* x, float* out, std::int64_t n, float c);
  /// out[i] = op(x[i]) rounded to bf16 as it is written (bf16(float) of unary's out): the
  /// input of the bf16 policy's next matmul in one pass. Null where the device has none.
  void (*unary_bf16)(UnaryOp op, const float* x, bf16* out, std::int64_t n, float c) = nullptr;
  /// out[i] = g[i] * op'(x[i]) for i < n, where y = op(x) is the forward's output; every
  /// op but AddScalar, MulScalar and NonZero (whose backward is another op). The CPU's
  /// accepts a null y for an op whose derivative reads only x (its fused GEMM epilogue
  /// keeps GeluTanh's input only).
  void (*unary_grad)(UnaryOp op, const float* g, const float* x, const float* y, float* out,
                     std::int64_t n, float c);
  /// out[i] = op(a[ia], b[ib]) for i < n (out's elements), a and b broadcast to out by
  /// their plans (f32).
  void (*binary)(BinaryOp op, const float* a, const BroadcastPlan& qa, const float* b,
                 const BroadcastPlan& qb, float* out, std::int64_t n);
  /// out[i] = mask[i] != 0 ? a[i] : b[i] for i < n (f32).
  void (*select)(const float* mask, const float* a, const float* b, float* out, std::int64_t n);
};

}  // namespace distjax::tensor::detail
