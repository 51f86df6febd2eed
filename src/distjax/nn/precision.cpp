#include "distjax/nn/precision.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"

namespace distjax::nn {

Tensor Precision::cast_to_compute(const Tensor& x) const {
  if (!x.defined() || !is_floating(x.dtype()) || x.dtype() == compute_dtype) return x;
  return tensor::astype(x, compute_dtype);
}

std::string Precision::str() const {
  if (!mixed() && param_dtype == DType::F32) return "f32";
  return std::string(dtype_name(compute_dtype)) + " compute, " + dtype_name(param_dtype) +
         " params";
}

Tensor linear(const Precision& policy, const Tensor& x, const Tensor& w, const Tensor& bias) {
  return linear(policy, x, w, bias, tensor::LinearEpilogue{});
}

Tensor linear(const Precision& policy, const Tensor& x, const Tensor& w, const Tensor& bias,
              const tensor::LinearEpilogue& epilogue) {
  if (!policy.mixed()) return tensor::linear(x, w, bias, epilogue);
  return tensor::linear(policy.cast_to_compute(x), policy.cast_to_compute(w), bias, epilogue);
}

Tensor matmul(const Precision& policy, const Tensor& a, const Tensor& b, bool trans_a,
              bool trans_b) {
  if (!policy.mixed()) return tensor::matmul(a, b, trans_a, trans_b);
  return tensor::matmul(policy.cast_to_compute(a), policy.cast_to_compute(b), trans_a, trans_b);
}

}  // namespace distjax::nn
