// The ops of the public API as functions of distjax._distjax (python/distjax/__init__.py
// exports them with Python scalars and arrays accepted). Each releases the interpreter lock
// while it runs, so simulated devices compute in parallel.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/nn/initializers.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::python {

namespace {
using Released = nb::call_guard<nb::gil_scoped_release>;
namespace t = tensor;

Tensor or_undefined(const std::optional<Tensor>& x) {
  return x ? *x : Tensor();
}
}  // namespace

void bind_ops(nb::module_& m) {
  using nb::arg;
  // Elementwise, with broadcasting.
  m.def("add", &t::add, Released());
  m.def("sub", &t::sub, Released());
  m.def("mul", &t::mul, Released());
  m.def("div", &t::div, Released());
  m.def("maximum", &t::maximum, Released());
  m.def("add_scalar", &t::add_scalar, Released());
  m.def("mul_scalar", &t::mul_scalar, Released());
  m.def("pow_scalar", &t::pow_scalar, Released());
  m.def("where", &t::where, Released());
  for (auto [name, fn] : {std::pair{"neg", &t::neg}, {"exp", &t::exp}, {"log", &t::log},
                          {"sqrt", &t::sqrt}, {"rsqrt", &t::rsqrt}, {"square", &t::square},
                          {"tanh", &t::tanh}, {"sigmoid", &t::sigmoid}, {"relu", &t::relu},
                          {"silu", &t::silu}})
    m.def(name, fn, Released());
  m.def("gelu", [](const Tensor& x, bool approximate) { return t::gelu(x, approximate); },
        arg("x"), arg("approximate") = true, Released());
  m.def("astype", &t::astype, Released());

  // Products.
  m.def("matmul", &t::matmul, arg("a"), arg("b"), arg("trans_a") = false, arg("trans_b") = false,
        Released());
  m.def("linear",
        [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
          return t::linear(x, w, or_undefined(b));
        },
        arg("x"), arg("w"), arg("b") = nb::none(), Released());

  // Reductions: over every axis when `axes` is None.
  auto reduction = [&](const char* name, auto all, auto some) {
    m.def(name,
          [all, some](const Tensor& x, const std::optional<std::vector<int>>& axes, bool keepdims) {
            return axes ? some(x, *axes, keepdims) : all(x);
          },
          arg("x"), arg("axes") = nb::none(), arg("keepdims") = false, Released());
  };
  reduction("sum", [](const Tensor& x) { return t::sum(x); },
            [](const Tensor& x, const std::vector<int>& a, bool k) { return t::sum(x, a, k); });
  reduction("mean", [](const Tensor& x) { return t::mean(x); },
            [](const Tensor& x, const std::vector<int>& a, bool k) { return t::mean(x, a, k); });
  reduction("max", [](const Tensor& x) { return t::max(x); },
            [](const Tensor& x, const std::vector<int>& a, bool k) { return t::max(x, a, k); });
  m.def("argmax", &t::argmax, arg("x"), arg("axis") = -1, Released());

  // Neural-network ops.
  m.def("softmax", &t::softmax, arg("x"), arg("axis") = -1, Released());
  m.def("log_softmax", &t::log_softmax, arg("x"), arg("axis") = -1, Released());
  m.def("layer_norm",
        [](const Tensor& x, const Tensor& g, const Tensor& b, float eps) {
          return t::layer_norm(x, g, b, eps);
        },
        arg("x"), arg("gamma"), arg("beta"), arg("eps") = 1e-5f, Released());
  m.def("rms_norm", &t::rms_norm, arg("x"), arg("gamma"), arg("eps") = 1e-6f, Released());
  m.def("embedding", &t::embedding, arg("table"), arg("ids"), Released());
  m.def("cross_entropy", &t::cross_entropy, arg("logits"), arg("labels"), Released());

  // Shapes.
  m.def("reshape", &t::reshape, arg("x"), arg("shape"), Released());
  m.def("transpose", &t::transpose, arg("x"), arg("d0") = -2, arg("d1") = -1, Released());
  m.def("permute", &t::permute, arg("x"), arg("perm"), Released());
  m.def("slice", &t::slice, arg("x"), arg("axis"), arg("start"), arg("end"), Released());
  m.def("concat", &t::concat, arg("xs"), arg("axis") = 0, Released());
  m.def("stack", &t::stack, arg("xs"), arg("axis") = 0, Released());
  m.def("split", nb::overload_cast<const Tensor&, int, int>(&t::split), arg("x"), arg("n"),
        arg("axis") = 0, Released());
  m.def("broadcast_to", &t::broadcast_to, arg("x"), arg("shape"), Released());

  // Factories (on the calling thread's current device).
  m.def("zeros", [](const Shape& s, DType d) { return Tensor::zeros(s, d); }, arg("shape"),
        arg("dtype") = DType::F32, Released());
  m.def("ones", [](const Shape& s, DType d) { return Tensor::ones(s, d); }, arg("shape"),
        arg("dtype") = DType::F32, Released());
  m.def("full", [](const Shape& s, double v, DType d) { return Tensor::full(s, v, d); },
        arg("shape"), arg("value"), arg("dtype") = DType::F32, Released());
  m.def("arange", [](std::int64_t n, DType d) { return Tensor::arange(n, d); }, arg("n"),
        arg("dtype") = DType::I64, Released());
  m.def("normal",
        [](std::uint64_t seed, const Shape& s, double stddev) {
          return nn::normal(stddev)(Key::from_seed(seed), s);
        },
        arg("seed"), arg("shape"), arg("stddev") = 1.0, Released(),
        "Normal samples with DistJax's counter-based generator (the same on every machine)");
}

}  // namespace distjax::python
