// Precision: the mixed-precision policy a Scope carries (JAX jmp's Policy, Flax's dtype and
// param_dtype): parameters stay f32 (master weights), matmul operands are cast to the
// compute dtype, everything else computes in f32.
#pragma once

#include <string>

#include "distjax/core/dtype.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::nn {

using tensor::Tensor;

/// A mixed-precision policy, a small value carried by nn::Scope (Scope::with_precision).
///
///  - param_dtype: how parameters are stored and updated (the master weights): f32.
///  - compute_dtype: the dtype the layers' matmuls read. Dense, Embedding::attend, the
///    tensor-parallel heads and the parallel block cast their activation and their kernel
///    to it (astype, whose backward hands the cotangent back in f32) and call
///    tensor::linear / tensor::matmul, which accumulate and write f32.
///
/// The ops between the matmuls (layer/RMS norm, softmax, GELU, residual adds,
/// cross-entropy, reductions) compute in f32. Where an activation's only consumer reads it
/// in compute_dtype, its producer writes it so instead of f32 and its cast (the
/// transformer's layer norms, attention's output, the MLP's fc1 with its GELU in the
/// product's epilogue, the QKV projection where the attention reads bf16 as it is:
/// Dense::gelu and Dense::compute_dtype_output); the residual stream and the loss stay f32.
/// The backward then writes such an activation's cotangent in compute_dtype too
/// (tensor::Node::reduced_cotangent). Attention's products may read compute_dtype operands
/// (tensor::attention's `compute`: bf16 on a GPU's tensor cores, f32 on the CPU).
///
///   nn::Scope s = nn::Scope::apply(&params, true, key).with_precision(nn::Precision::bf16());
///   Tensor y = nn::Dense{.features = 64}(s.child("fc"), x);  // bf16 GEMM, f32 y
struct Precision {
  DType param_dtype = DType::F32;
  DType compute_dtype = DType::F32;

  /// Everything f32 (the default; bit-identical to a scope without a policy).
  static Precision f32() { return {}; }
  /// bf16 matmuls (oneDNN, AVX-512 BF16, f32 accumulation), f32 master weights.
  static Precision bf16() { return {.compute_dtype = DType::BF16}; }
  /// f16 matmul operands (f16 range and precision, f32 products on this CPU), f32
  /// master weights; train with a loss scale (train::DynamicLossScale).
  static Precision fp16() { return {.compute_dtype = DType::F16}; }

  /// Whether the policy casts anything (compute_dtype != f32).
  bool mixed() const { return compute_dtype != DType::F32; }
  /// x cast to compute_dtype (differentiable; x itself when it already is, or when x is
  /// not floating).
  Tensor cast_to_compute(const Tensor& x) const;
  /// "f32", "bf16 compute, f32 params", ...
  std::string str() const;
  bool operator==(const Precision&) const = default;
};

/// x (..., K) @ w (K, N) [+ bias (N)] under `policy`: x and w in the compute dtype, bias
/// and result f32 (tensor::linear).
Tensor linear(const Precision& policy, const Tensor& x, const Tensor& w,
              const Tensor& bias = Tensor());
/// The same with the product's epilogue (tensor::LinearEpilogue): GELU, the output in f32
/// or the compute dtype (`epilogue.out`), a residual added.
Tensor linear(const Precision& policy, const Tensor& x, const Tensor& w, const Tensor& bias,
              const tensor::LinearEpilogue& epilogue);
/// tensor::matmul(a, b, trans_a, trans_b) with both operands in the compute dtype; f32 result.
Tensor matmul(const Precision& policy, const Tensor& a, const Tensor& b, bool trans_a = false,
              bool trans_b = false);

}  // namespace distjax::nn
