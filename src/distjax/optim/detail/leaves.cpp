#include "distjax/optim/detail/leaves.hpp"

#include <cmath>

#include "distjax/core/error.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::optim::detail {

namespace {
// Elements above which the Adam update runs on all OpenMP threads (7 streams of 4 bytes
// per element: ~1 MiB of traffic at the threshold, well above a fork/join's cost).
constexpr std::int64_t kParallelAdamGrain = 32768;
}  // namespace

const Tensor& checked_grad(const char* op, const std::string& path, const Tensor& p,
                           const TensorTree& grads) {
  DISTJAX_CHECK(p.dtype() == DType::F32, InvalidArgument, "[", op, "] parameter \"", path, "\" is ",
                dtype_name(p.dtype()), "; optimizers update f32 parameters");
  DISTJAX_CHECK(grads.contains(path), InvalidArgument, "[", op, "] no gradient for parameter \"",
                path, "\" (the gradient tree has ", grads.size(), " leaves)");
  const Tensor& g = grads.at(path);
  DISTJAX_CHECK(g.dtype() == DType::F32 && g.shape() == p.shape(), InvalidArgument, "[", op,
                "] gradient of \"", path, "\" is ", dtype_name(g.dtype()), " ",
                to_string(g.shape()), ", expected f32 ", to_string(p.shape()));
  return g;
}

const Tensor& checked_slot(const char* op, const char* slot, const std::string& path,
                           const Tensor& p, const TensorTree& state) {
  const std::string key = std::string(slot) + "/" + path;
  DISTJAX_CHECK(state.contains(key), InvalidArgument, "[", op, "] optimizer state has no \"", key,
                "\"; was the state created by this optimizer's init() for these params?");
  const Tensor& s = state.at(key);
  DISTJAX_CHECK(s.dtype() == DType::F32 && s.shape() == p.shape(), InvalidArgument, "[", op,
                "] state \"", key, "\" is ", dtype_name(s.dtype()), " ", to_string(s.shape()),
                ", expected f32 ", to_string(p.shape()));
  return s;
}

void add_zero_slot(TensorTree& state, const std::string& slot, const TensorTree& params) {
  for (const auto& [path, p] : params)
    if (trainable(p)) state.set(slot + "/" + path, Tensor::zeros(p.shape(), DType::F32));
}

void adam_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, std::int64_t n, double lr, double b1, double b2, double eps,
                 std::int64_t t, double decay, double l2) {
  // PyTorch's formulation: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps.
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
  const float c1 = static_cast<float>(1.0 - b1), c2 = static_cast<float>(1.0 - b2);
  const float feps = static_cast<float>(eps), fdecay = static_cast<float>(decay);
  const float fl2 = static_cast<float>(l2);
  // Elementwise (no reduction), so the result does not depend on the thread count; large
  // leaves are split over the OpenMP threads instead of leaving the other cores idle
  // (the GPT benchmark's AdamW update was ~4% of a 2-thread step on one thread).
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelAdamGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * fdecay;
    const float gi = g[i] + fl2 * pi;
    const float mi = fb1 * m[i] + c1 * gi;
    const float vi = fb2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + feps);
  }
}

TensorTree adam_init(const TensorTree& params) {
  TensorTree state;
  add_zero_slot(state, "mu", params);
  add_zero_slot(state, "nu", params);
  return state;
}

void adam_update(const char* op, TensorTree& params, const TensorTree& grads, TensorTree& state,
                 std::int64_t step, double lr, double b1, double b2, double eps,
                 const std::function<double(const std::string& path)>& decay, double l2) {
  tensor::NoGradGuard no_grad;
  for (auto& [path, p] : params) {
    if (!trainable(p)) continue;
    const Tensor& g = checked_grad(op, path, p, grads);
    const Tensor& m = checked_slot(op, "mu", path, p, state);
    const Tensor& v = checked_slot(op, "nu", path, p, state);
    adam_kernel(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), lr,
                b1, b2, eps, step + 1, decay(path), l2);
  }
}

}  // namespace distjax::optim::detail
