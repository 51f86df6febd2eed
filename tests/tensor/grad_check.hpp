// Gradient harness (after ggml's test-backend-ops): one GradCase per op with its own
// tolerance. The analytic gradient of L = sum_o sum(fn(x)_o * c_o), for fixed random
// cotangents c_o, comes from autodiff::value_and_grad; the numeric one from central
// differences of L in double precision, perturbing every input element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/distjax.hpp"

namespace distjax::testing {

using tensor::Tensor;
using tensor::TensorTree;

/// One op under test: f32 inputs (all differentiated), a function of them returning one
/// or more f32 outputs, the finite-difference step and the tolerance
/// |analytic - numeric| <= atol + rtol * |numeric| per element.
struct GradCase {
  std::string name;
  std::vector<Tensor> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  double eps = 1e-2;
  double rtol = 1e-2;
  double atol = 1e-3;
};

/// Uniform values in [lo, hi) from a fixed key, on the current device.
inline Tensor uniform(const Shape& shape, std::uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  random_uniform(Key::from_seed(seed), v.data(), numel(shape), lo, hi);
  return Tensor::from_vector(v, shape);
}

/// got's elements within tol * (1 + |want|) of want's (a reference in double).
inline void expect_close(const Tensor& got, const std::vector<double>& want, double tol,
                         const char* what) {
  ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size())) << what;
  const std::vector<float> p = got.to_vector<float>();
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(p[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " at " << i;
}

/// The same against another f32 tensor of got's shape.
inline void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> p = want.to_vector<float>();
  expect_close(got, std::vector<double>(p.begin(), p.end()), tol, what);
}

/// Uniform magnitudes in [lo, hi) with random signs: values kept away from 0 (relu, abs).
inline Tensor away_from_zero(const Shape& shape, std::uint64_t seed, float lo, float hi) {
  std::vector<float> p = uniform(shape, seed, lo, hi).to_vector<float>();
  const std::vector<float> ps = uniform(shape, seed + 7919, -1.f, 1.f).to_vector<float>();
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] = ps[i] < 0.f ? -p[i] : p[i];
  return Tensor::from_vector(p, shape);
}

/// A random permutation of {0, gap, 2 gap, ...} shifted to be centred: no two values tie,
/// so max and maximum have a well-defined gradient when eps < gap / 2.
inline Tensor distinct(const Shape& shape, std::uint64_t seed, float gap = 0.1f) {
  const std::int64_t n = numel(shape);
  std::vector<float> keys(static_cast<std::size_t>(n));
  random_uniform(Key::from_seed(seed), keys.data(), n);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return keys[a] < keys[b]; });
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[order[i]] = (static_cast<float>(i) - 0.5f * n) * gap;
  return Tensor::from_vector(v, shape);
}

/// Single-output convenience for GradCase::fn.
template <class F>
std::function<std::vector<Tensor>(const std::vector<Tensor>&)> one(F f) {
  return [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x)}; };
}

namespace detail {

inline std::string leaf_name(std::size_t i) {
  return "in" + std::to_string(100 + i);
}

inline double weighted_sum(const std::vector<Tensor>& ys, const std::vector<Tensor>& cs) {
  double acc = 0.0;
  for (std::size_t o = 0; o < ys.size(); ++o) {
    const std::vector<float> py = ys[o].to_vector<float>();
    const std::vector<float> pc = cs[o].to_vector<float>();
    for (std::size_t i = 0; i < py.size(); ++i)
      acc += static_cast<double>(py[i]) * pc[i];
  }
  return acc;
}

}  // namespace detail

/// Checks every input's analytic gradient against central differences.
inline ::testing::AssertionResult check_gradients(const GradCase& c) {
  std::vector<Tensor> xs;
  for (const Tensor& t : c.inputs)
    xs.push_back(t.clone());
  // Fixed cotangents, one per output, from a key derived from the case name.
  std::vector<Tensor> cots;
  {
    tensor::NoGradGuard off;
    std::vector<Tensor> ys = c.fn(xs);
    for (std::size_t o = 0; o < ys.size(); ++o) {
      std::vector<float> ct(static_cast<std::size_t>(ys[o].numel()));
      random_normal(Key::from_seed(2024).fold_in(c.name).fold_in(o), ct.data(), ys[o].numel());
      cots.push_back(Tensor::from_vector(ct, ys[o].shape()));
    }
  }
  TensorTree params;
  for (std::size_t i = 0; i < xs.size(); ++i)
    params.set(detail::leaf_name(i), xs[i]);
  auto loss_fn = [&](const TensorTree& p) {
    std::vector<Tensor> in;
    for (std::size_t i = 0; i < xs.size(); ++i)
      in.push_back(p.at(detail::leaf_name(i)));
    std::vector<Tensor> ys = c.fn(in);
    Tensor loss = tensor::sum(tensor::mul(ys[0], cots[0]));
    for (std::size_t o = 1; o < ys.size(); ++o)
      loss = tensor::add(loss, tensor::sum(tensor::mul(ys[o], cots[o])));
    return loss;
  };
  auto [loss, grads] = autodiff::value_and_grad(loss_fn)(params);

  tensor::NoGradGuard off;
  std::ostringstream fail;
  double worst = 0.0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& ga = grads.at(detail::leaf_name(i));
    if (ga.shape() != xs[i].shape())
      return ::testing::AssertionFailure()
             << c.name << ": gradient of input " << i << " has shape " << to_string(ga.shape())
             << ", expected " << to_string(xs[i].shape());
    // Perturbed copies of input i go through the host (the inputs may live on a device).
    const std::vector<float> pa = ga.to_vector<float>();
    std::vector<float> px = xs[i].to_vector<float>();
    const Tensor unperturbed = xs[i];
    for (std::size_t j = 0; j < px.size(); ++j) {
      const float orig = px[j];
      px[j] = static_cast<float>(orig + c.eps);
      xs[i] = Tensor::from_vector(px, unperturbed.shape());
      const double hi = detail::weighted_sum(c.fn(xs), cots);
      px[j] = static_cast<float>(orig - c.eps);
      xs[i] = Tensor::from_vector(px, unperturbed.shape());
      const double lo = detail::weighted_sum(c.fn(xs), cots);
      px[j] = orig;
      xs[i] = unperturbed;
      const double num = (hi - lo) / (2.0 * c.eps);
      const double err = std::abs(pa[j] - num);
      const double tol = c.atol + c.rtol * std::abs(num);
      if (!(err <= tol) && err / tol > worst) {  // also catches NaN
        worst = std::isnan(err) ? INFINITY : err / tol;
        fail.str("");
        fail << c.name << ": input " << i << " " << to_string(xs[i].shape()) << " element " << j
             << ": analytic " << pa[j] << " vs numeric " << num << " (|diff| " << err << " > tol "
             << tol << ")";
      }
    }
  }
  if (worst > 0.0) return ::testing::AssertionFailure() << fail.str();
  return ::testing::AssertionSuccess();
}

}  // namespace distjax::testing
