#include "distjax/tensor/elementwise.hpp"

#include <cmath>

#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::tensor {
namespace {

using detail::kParallelGrain;
using detail::kParallelGrainMemory;

template <class F>
Tensor map_binary(const char* op, const Tensor& a, const Tensor& b, F f) {
  detail::require_f32(op, {&a, &b});
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape(), op));
  detail::broadcast_binary(a, b, out, f);
  return out;
}

// `grain`: kParallelGrain for transcendental f, kParallelGrainMemory for a few flops.
template <class F>
Tensor map_unary(const char* op, const Tensor& x, F f, std::int64_t grain = kParallelGrain) {
  detail::require_f32(op, {&x});
  Tensor out = Tensor::empty(x.shape());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd if (parallel: n > grain)
  for (std::int64_t i = 0; i < n; ++i)
    po[i] = f(px[i]);
  return out;
}

// grad * f'(x, y) elementwise, where y is the forward output (both saved detached).
template <class F>
Tensor map_grad(const Tensor& g, const Tensor& x, const Tensor& y, F dfdx, std::int64_t grain) {
  Tensor out = Tensor::empty(x.shape());
  const float* pg = g.data<float>();
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd if (parallel: n > grain)
  for (std::int64_t i = 0; i < n; ++i)
    po[i] = pg[i] * dfdx(px[i], py[i]);
  return out;
}

// A unary op and its derivative in terms of (x, y = f(x)), recorded together.
template <class F, class D>
Tensor unary_op(const char* op, const Tensor& x, F f, D dfdx, std::int64_t grain = kParallelGrain) {
  Tensor y = map_unary(op, x, f, grain);
  if (!needs_grad({&x})) return joined(y, {&x});
  return record(op, {x}, y,
                [xs = x.detach(), ys = y.detach(), dfdx, grain](const std::vector<Tensor>& g) {
                  return std::vector<Tensor>{map_grad(g[0], xs, ys, dfdx, grain)};
                });
}

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("add", a, b, [](float x, float y) { return x + y; });
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("sub", a, b, [](float x, float y) { return x - y; });
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("mul", a, b, [](float x, float y) { return x * y; });
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("mul", {a, b}, out,
                [ad = a.detach(), bd = b.detach(), ra = a.requires_grad(),
                 rb = b.requires_grad()](const std::vector<Tensor>& g) {
                  return std::vector<Tensor>{ra ? sum_to(mul(g[0], bd), ad.shape()) : Tensor(),
                                             rb ? sum_to(mul(g[0], ad), bd.shape()) : Tensor()};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("div", a, b, [](float x, float y) { return x / y; });
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("div", {a, b}, out,
                [ad = a.detach(), bd = b.detach(), od = out.detach(),
                 rb = b.requires_grad()](const std::vector<Tensor>& g) {
                  Tensor ga = sum_to(div(g[0], bd), ad.shape());
                  // d(a/b)/db = -(a/b)/b
                  Tensor gb = rb ? sum_to(neg(div(mul(g[0], od), bd)), bd.shape()) : Tensor();
                  return std::vector<Tensor>{ga, gb};
                });
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("maximum", a, b, [](float x, float y) { return x >= y ? x : y; });
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record(
      "maximum", {a, b}, out, [ad = a.detach(), bd = b.detach()](const std::vector<Tensor>& g) {
        Tensor mask_a =
            map_binary("maximum", ad, bd, [](float x, float y) { return x >= y ? 1.f : 0.f; });
        Tensor ga = mul(g[0], mask_a);
        Tensor gb = sub(g[0], ga);
        return std::vector<Tensor>{sum_to(ga, ad.shape()), sum_to(gb, bd.shape())};
      });
}

// ---------------------------------------------------------------- scalar

Tensor add_scalar(const Tensor& x, double s) {
  const float c = static_cast<float>(s);
  Tensor y = map_unary(
      "add_scalar", x, [c](float v) { return v + c; }, kParallelGrainMemory);
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("add_scalar", {x}, y,
                [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
}

Tensor mul_scalar(const Tensor& x, double s) {
  const float c = static_cast<float>(s);
  Tensor y = map_unary(
      "mul_scalar", x, [c](float v) { return v * c; }, kParallelGrainMemory);
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("mul_scalar", {x}, y, [s](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul_scalar(g[0], s)};
  });
}

Tensor pow_scalar(const Tensor& x, double p) {
  const float e = static_cast<float>(p);
  // Common exponents avoid the libm call so the loop vectorises.
  if (p == 1.0)
    return unary_op(
        "pow_scalar", x, [](float v) { return v; }, [](float, float) { return 1.f; },
        kParallelGrainMemory);
  if (p == 2.0)
    return unary_op(
        "pow_scalar", x, [](float v) { return v * v; }, [](float v, float) { return 2.f * v; },
        kParallelGrainMemory);
  if (p == 3.0)
    return unary_op(
        "pow_scalar", x, [](float v) { return v * v * v; },
        [](float v, float) { return 3.f * v * v; });
  if (p == 0.5)
    return unary_op(
        "pow_scalar", x, [](float v) { return std::sqrt(v); },
        [](float, float y) { return 0.5f / y; });
  if (p == -1.0)
    return unary_op(
        "pow_scalar", x, [](float v) { return 1.f / v; }, [](float, float y) { return -y * y; });
  return unary_op(
      "pow_scalar", x, [e](float v) { return std::pow(v, e); },
      [e](float v, float) { return e * std::pow(v, e - 1.f); });
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  return mul_scalar(x, -1.0);
}

Tensor exp(const Tensor& x) {
  return unary_op(
      "exp", x, [](float v) { return detail::fast_exp(v); }, [](float, float y) { return y; });
}

Tensor log(const Tensor& x) {
  return unary_op(
      "log", x, [](float v) { return std::log(v); }, [](float v, float) { return 1.f / v; });
}

Tensor sqrt(const Tensor& x) {
  return unary_op(
      "sqrt", x, [](float v) { return std::sqrt(v); }, [](float, float y) { return 0.5f / y; });
}

Tensor rsqrt(const Tensor& x) {
  return unary_op(
      "rsqrt", x, [](float v) { return 1.f / std::sqrt(v); },
      [](float v, float y) { return -0.5f * y / v; });
}

Tensor square(const Tensor& x) {
  return unary_op(
      "square", x, [](float v) { return v * v; }, [](float v, float) { return 2.f * v; },
      kParallelGrainMemory);
}

Tensor tanh(const Tensor& x) {
  return unary_op(
      "tanh", x, [](float v) { return detail::fast_tanh(v); },
      [](float, float y) { return 1.f - y * y; });
}

Tensor sigmoid(const Tensor& x) {
  return unary_op(
      "sigmoid", x, [](float v) { return detail::fast_sigmoid(v); },
      [](float, float y) { return y * (1.f - y); });
}

Tensor relu(const Tensor& x) {
  return unary_op(
      "relu", x, [](float v) { return v > 0.f ? v : 0.f; },
      [](float v, float) { return v > 0.f ? 1.f : 0.f; }, kParallelGrainMemory);
}

Tensor gelu(const Tensor& x, bool approximate) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  constexpr float kA = 0.044715f;
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  constexpr float kInvSqrt2Pi = 0.3989422804014327f;
  if (approximate) {
    return unary_op(
        "gelu", x,
        [](float v) { return 0.5f * v * (1.f + detail::fast_tanh(kC * (v + kA * v * v * v))); },
        [](float v, float) {
          float t = detail::fast_tanh(kC * (v + kA * v * v * v));
          return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kC * (1.f + 3.f * kA * v * v);
        });
  }
  return unary_op(
      "gelu", x, [](float v) { return 0.5f * v * (1.f + detail::fast_erf(v * kInvSqrt2)); },
      [](float v, float) {
        return 0.5f * (1.f + detail::fast_erf(v * kInvSqrt2)) +
               v * kInvSqrt2Pi * detail::fast_exp(-0.5f * v * v);
      });
}

Tensor silu(const Tensor& x) {
  return unary_op(
      "silu", x, [](float v) { return v * detail::fast_sigmoid(v); },
      [](float v, float) {
        float s = detail::fast_sigmoid(v);
        return s * (1.f + v * (1.f - s));
      });
}

// ---------------------------------------------------------------- selection, casts

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::require_f32("where", {&a, &b});
  Tensor c = cond.dtype() == DType::F32 ? cond : astype(cond, DType::F32);
  Shape shape =
      broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), "where"), b.shape(), "where");
  auto expand = [&](const Tensor& t) {
    if (t.shape() == shape) return t;
    Tensor o = Tensor::empty(shape);
    detail::broadcast_copy(t, o);
    return o;
  };
  Tensor mask = expand(c), af = expand(a), bf = expand(b);
  Tensor out = Tensor::empty(shape);
  const float* pm = mask.data<float>();
  const float* pa = af.data<float>();
  const float* pb = bf.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = out.numel();
#pragma omp parallel for simd if (parallel: n > kParallelGrainMemory)
  for (std::int64_t i = 0; i < n; ++i) {
    // Both loads unconditional: clang vectorises a select, not a conditional load.
    const float x = pa[i], y = pb[i];
    po[i] = pm[i] != 0.f ? x : y;
  }
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record(
      "where", {a, b}, out, [mask, sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
        Tensor ga = mul(g[0], map_unary(
                                  "where", mask, [](float m) { return m != 0.f ? 1.f : 0.f; },
                                  kParallelGrainMemory));
        return std::vector<Tensor>{sum_to(ga, sa), sum_to(sub(g[0], ga), sb)};
      });
}

Tensor astype(const Tensor& x, DType dtype) {
  check_defined(x, "astype", "x");
  detail::require_cpu("astype", {&x});
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype);
  detail::convert(x, out);
  if (!is_floating(x.dtype()) || !is_floating(dtype) || !needs_grad({&x})) return joined(out, {&x});
  return record("astype", {x}, out, [from = x.dtype()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{astype(g[0], from)};
  });
}

}  // namespace distjax::tensor
