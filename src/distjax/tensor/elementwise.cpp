#include "distjax/tensor/elementwise.hpp"

#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::BinaryOp;
using detail::Dispatch;
using detail::KernelTable;
using detail::UnaryOp;

Tensor map_binary(const char* op, BinaryOp code, const Tensor& a, const Tensor& b) {
  detail::require_f32(op, {&a, &b});
  const Device device = detail::op_device(op, {&a, &b});
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape(), op), DType::F32, device);
  const detail::BroadcastPlan qa = detail::plan_broadcast(a.shape(), out.shape(), op);
  const detail::BroadcastPlan qb = detail::plan_broadcast(b.shape(), out.shape(), op);
  Dispatch k(op, &KernelTable::elementwise, {&a, &b, &out});
  k->binary(code, a.data<float>(), qa, b.data<float>(), qb, out.data<float>(), out.numel());
  return out;
}

// `c`: the scalar of AddScalar/MulScalar, the exponent of Pow.
Tensor map_unary(const char* op, const Tensor& x, UnaryOp code, float c = 0.f) {
  detail::require_f32(op, {&x});
  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device());
  Dispatch k(op, &KernelTable::elementwise, {&x, &out});
  k->unary(code, x.data<float>(), out.data<float>(), x.numel(), c);
  return out;
}

// grad * f'(x, y) elementwise, where y is the forward output (both saved detached).
Tensor map_grad(const char* op, const Tensor& g, const Tensor& x, const Tensor& y, UnaryOp code,
                float c) {
  Tensor out = Tensor::empty(x.shape(), DType::F32, detail::op_device(op, {&g, &x, &y}));
  Dispatch k(op, &KernelTable::elementwise, {&g, &x, &y, &out});
  k->unary_grad(code, g.data<float>(), x.data<float>(), y.data<float>(), out.data<float>(),
                x.numel(), c);
  return out;
}

// A unary op and its derivative in terms of (x, y = f(x)), recorded together.
// Whether op's derivative reads its input x, and its output y (the kernels' df(x, y)): the
// backward keeps only what it reads (GELU's reads x alone, tanh's y alone), and hands the
// kept one to the kernel's unused argument too.
bool grad_reads_input(UnaryOp code) {
  return code != UnaryOp::Exp && code != UnaryOp::Tanh && code != UnaryOp::Sigmoid &&
         code != UnaryOp::Sqrt && code != UnaryOp::Reciprocal;
}
bool grad_reads_output(UnaryOp code) {
  return code == UnaryOp::Exp || code == UnaryOp::Tanh || code == UnaryOp::Sigmoid ||
         code == UnaryOp::Sqrt || code == UnaryOp::Reciprocal || code == UnaryOp::Rsqrt;
}

// The recorded backward of a unary op with output y (f32, or bf16 for an op that never
// reads y); a cotangent that is not f32 is widened first.
Tensor record_unary(const char* op, const Tensor& x, const Tensor& y, UnaryOp code, float c) {
  const Tensor xs = grad_reads_input(code) ? x.detach() : Tensor();
  const Tensor ys = grad_reads_output(code) ? y.detach() : Tensor();
  return record(op, {x}, y, [op, xs, ys, code, c](const std::vector<Tensor>& g) {
    const Tensor& xa = xs.defined() ? xs : ys;
    const Tensor& ya = ys.defined() ? ys : xs;
    return std::vector<Tensor>{map_grad(op, astype(g[0], DType::F32), xa, ya, code, c)};
  });
}

Tensor unary_op(const char* op, const Tensor& x, UnaryOp code, float c = 0.f) {
  Tensor y = map_unary(op, x, code, c);
  if (!needs_grad({&x})) return joined(y, {&x});
  return record_unary(op, x, y, code, c);
}

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("add", BinaryOp::Add, a, b);
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("sub", BinaryOp::Sub, a, b);
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("mul", BinaryOp::Mul, a, b);
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("mul", {a, b}, out,
                [ad = a.detach(), bd = b.detach(), ra = a.requires_grad(),
                 rb = b.requires_grad()](const std::vector<Tensor>& g) {
                  return std::vector<Tensor>{ra ? sum_to(mul(g[0], bd), ad.shape()) : Tensor(),
                                             rb ? sum_to(mul(g[0], ad), bd.shape()) : Tensor()};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = map_binary("div", BinaryOp::Div, a, b);
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
  Tensor out = map_binary("maximum", BinaryOp::Maximum, a, b);
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("maximum", {a, b}, out,
                [ad = a.detach(), bd = b.detach()](const std::vector<Tensor>& g) {
                  Tensor mask_a = map_binary("maximum", BinaryOp::GreaterEqual, ad, bd);
                  Tensor ga = mul(g[0], mask_a);
                  Tensor gb = sub(g[0], ga);
                  return std::vector<Tensor>{sum_to(ga, ad.shape()), sum_to(gb, bd.shape())};
                });
}

// ---------------------------------------------------------------- scalar

Tensor add_scalar(const Tensor& x, double s) {
  Tensor y = map_unary("add_scalar", x, UnaryOp::AddScalar, static_cast<float>(s));
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("add_scalar", {x}, y,
                [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
}

Tensor mul_scalar(const Tensor& x, double s) {
  Tensor y = map_unary("mul_scalar", x, UnaryOp::MulScalar, static_cast<float>(s));
  if (!needs_grad({&x})) return joined(y, {&x});
  return record("mul_scalar", {x}, y, [s](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul_scalar(g[0], s)};
  });
}

Tensor pow_scalar(const Tensor& x, double p) {
  // Common exponents have their own kernels, which avoid the libm call.
  if (p == 1.0) return unary_op("pow_scalar", x, UnaryOp::Identity);
  if (p == 2.0) return unary_op("pow_scalar", x, UnaryOp::Square);
  if (p == 3.0) return unary_op("pow_scalar", x, UnaryOp::Cube);
  if (p == 0.5) return unary_op("pow_scalar", x, UnaryOp::Sqrt);
  if (p == -1.0) return unary_op("pow_scalar", x, UnaryOp::Reciprocal);
  return unary_op("pow_scalar", x, UnaryOp::Pow, static_cast<float>(p));
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  return mul_scalar(x, -1.0);
}

Tensor exp(const Tensor& x) {
  return unary_op("exp", x, UnaryOp::Exp);
}

Tensor log(const Tensor& x) {
  return unary_op("log", x, UnaryOp::Log);
}

Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", x, UnaryOp::Sqrt);
}

Tensor rsqrt(const Tensor& x) {
  return unary_op("rsqrt", x, UnaryOp::Rsqrt);
}

Tensor square(const Tensor& x) {
  return unary_op("square", x, UnaryOp::Square);
}

Tensor tanh(const Tensor& x) {
  return unary_op("tanh", x, UnaryOp::Tanh);
}

Tensor sigmoid(const Tensor& x) {
  return unary_op("sigmoid", x, UnaryOp::Sigmoid);
}

Tensor relu(const Tensor& x) {
  return unary_op("relu", x, UnaryOp::Relu);
}

Tensor gelu(const Tensor& x, bool approximate, DType out) {
  DISTJAX_CHECK(is_floating(out), InvalidArgument, "[gelu] writes f32, bf16 or f16, not ",
                dtype_name(out));
  const UnaryOp code = approximate ? UnaryOp::GeluTanh : UnaryOp::GeluErf;
  if (out == DType::F32) return unary_op("gelu", x, code);
  // bf16 written by the kernel where the device has one; else the f32 op and its cast.
  detail::require_f32("gelu", {&x});
  const detail::ElementwiseKernels* fam = detail::kernel_table(x.device().kind).elementwise;
  if (out != DType::BF16 || fam == nullptr || fam->unary_bf16 == nullptr)
    return astype(gelu(x, approximate), out);
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  {
    Dispatch k("gelu", &KernelTable::elementwise, {&x, &y});
    k->unary_bf16(code, x.data<float>(), y.data<bf16>(), x.numel(), 0.f);
  }
  if (!needs_grad({&x})) return joined(y, {&x});
  return record_unary("gelu", x, y, code, 0.f);  // GELU's derivative reads x alone
}

Tensor silu(const Tensor& x) {
  return unary_op("silu", x, UnaryOp::Silu);
}

// ---------------------------------------------------------------- selection, casts

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::require_f32("where", {&a, &b});
  const Device device = detail::op_device("where", {&cond, &a, &b});
  Tensor c = cond.dtype() == DType::F32 ? cond : astype(cond, DType::F32);
  Shape shape =
      broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), "where"), b.shape(), "where");
  auto expand = [&](const Tensor& t) {
    if (t.shape() == shape) return t;
    Tensor o = Tensor::empty(shape, DType::F32, device);
    detail::broadcast_copy("where", t, o);
    return o;
  };
  Tensor mask = expand(c), af = expand(a), bf = expand(b);
  Tensor out = Tensor::empty(shape, DType::F32, device);
  {
    Dispatch k("where", &KernelTable::elementwise, {&mask, &af, &bf, &out});
    k->select(mask.data<float>(), af.data<float>(), bf.data<float>(), out.data<float>(),
              out.numel());
  }
  if (!needs_grad({&a, &b})) return joined(out, {&a, &b});
  return record("where", {a, b}, out,
                [mask, sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
                  Tensor ga = mul(g[0], map_unary("where", mask, UnaryOp::NonZero));
                  return std::vector<Tensor>{sum_to(ga, sa), sum_to(sub(g[0], ga), sb)};
                });
}

Tensor astype(const Tensor& x, DType dtype) {
  check_defined(x, "astype", "x");
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  detail::convert(x, out);
  if (!is_floating(x.dtype()) || !is_floating(dtype) || !needs_grad({&x})) return joined(out, {&x});
  return record("astype", {x}, out, [from = x.dtype()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{astype(g[0], from)};
  });
}

}  // namespace distjax::tensor
