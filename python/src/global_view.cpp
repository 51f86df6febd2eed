// The global view from Python (distjax.global_view): GlobalArray and its ops with their
// propagation rules, reshard, value_and_grad over parameter dicts, the communication plan;
// python/distjax/global_view.py builds global_map on shard_map with these.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/core/error.hpp"
#include "distjax/global/comm_plan.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/global_array.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/nn_ops.hpp"
#include "distjax/global/program.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/global/shape_ops.hpp"
#include "distjax/spmd/collectives.hpp"

namespace distjax::python {

namespace {

using global::GlobalArray;
using global::GlobalSharding;
using mesh::PartitionSpec;
using Released = nb::call_guard<nb::gil_scoped_release>;
namespace g = global;

/// A sharding from a PartitionSpec, or a (spec, partial axes) pair.
GlobalSharding sharding_of(nb::handle h) {
  if (nb::isinstance<GlobalSharding>(h)) return nb::cast<GlobalSharding>(h);
  return GlobalSharding{nb::cast<PartitionSpec>(h)};
}

/// An operand: a GlobalArray, or a number (the scalar ops).
template <class Op, class Scalar>
void def_operator(nb::class_<GlobalArray>& cls, const char* name, Op op, Scalar scalar,
                  bool reflected) {
  cls.def(name, [op, scalar, reflected](const GlobalArray& x, nb::handle other) {
    if (nb::isinstance<GlobalArray>(other)) {
      const GlobalArray y = nb::cast<GlobalArray>(other);
      nb::gil_scoped_release nogil;
      return reflected ? op(y, x) : op(x, y);
    }
    const double s = nb::cast<double>(other);
    nb::gil_scoped_release nogil;
    return scalar(x, s);
  });
}

}  // namespace

void bind_global_view(nb::module_& m) {
  using nb::arg;
  nb::module_ gv = m.def_submodule("global_view", "The global view (automatic mode)");
  nb::class_<GlobalSharding>(gv, "GlobalSharding",
                             "A PartitionSpec plus the mesh axes holding partial sums")
      .def(nb::init<PartitionSpec, std::vector<std::string>>(), arg("spec"),
           arg("partial") = std::vector<std::string>{})
      .def_ro("spec", &GlobalSharding::spec)
      .def_ro("partial", &GlobalSharding::partial)
      .def("__eq__", [](const GlobalSharding& a, const GlobalSharding& b) { return a == b; })
      .def("__repr__", &GlobalSharding::to_string);

  nb::class_<GlobalArray> cls(gv, "GlobalArray",
                              "Inside global_map: this device's block, the global shape and "
                              "the sharding");
  cls.def_prop_ro("shape", &GlobalArray::shape)
      .def_prop_ro("sharding", &GlobalArray::sharding)
      .def_prop_ro("local", &GlobalArray::local)
      .def_prop_ro("dtype", &GlobalArray::dtype)
      .def("__repr__", &GlobalArray::str)
      .def("__neg__", [](const GlobalArray& x) { return g::neg(x); }, Released())
      .def_prop_ro("T", [](const GlobalArray& x) { return g::transpose(x); });
  cls.attr("__array_ufunc__") = nb::none();
  auto add = [](const GlobalArray& a, const GlobalArray& b) { return g::add(a, b); };
  auto sub = [](const GlobalArray& a, const GlobalArray& b) { return g::sub(a, b); };
  auto mul = [](const GlobalArray& a, const GlobalArray& b) { return g::mul(a, b); };
  auto div = [](const GlobalArray& a, const GlobalArray& b) { return g::div(a, b); };
  auto add_s = [](const GlobalArray& x, double s) { return g::add_scalar(x, s); };
  auto mul_s = [](const GlobalArray& x, double s) { return g::mul_scalar(x, s); };
  def_operator(cls, "__add__", add, add_s, false);
  def_operator(cls, "__radd__", add, add_s, true);
  def_operator(cls, "__sub__", sub, [](const GlobalArray& x, double s) { return g::add_scalar(x, -s); },
               false);
  def_operator(cls, "__rsub__", sub,
               [](const GlobalArray& x, double s) { return g::add_scalar(g::neg(x), s); }, true);
  def_operator(cls, "__mul__", mul, mul_s, false);
  def_operator(cls, "__rmul__", mul, mul_s, true);
  def_operator(cls, "__truediv__", div,
               [](const GlobalArray& x, double s) { return g::mul_scalar(x, 1.0 / s); }, false);
  cls.def("__matmul__", [](const GlobalArray& a, const GlobalArray& b) {
    nb::gil_scoped_release nogil;
    return g::matmul(a, b);
  });

  // Making GlobalArrays inside a shard_map body (the device context is the thread's).
  gv.def("from_local",
         [](const Tensor& local, nb::handle sharding) {
           const GlobalSharding s = sharding_of(sharding);
           spmd::DeviceContext& ctx = current_context("GlobalArray.from_local");
           nb::gil_scoped_release nogil;
           return GlobalArray::from_local(ctx, local, s);
         },
         arg("local"), arg("sharding"), "Wraps this device's block (a shard_map input)");
  gv.def("from_host",
         [](nb::handle host, nb::handle sharding) {
           const Tensor t = tensor_from_object(host, false);
           const GlobalSharding s = sharding_of(sharding);
           spmd::DeviceContext& ctx = current_context("GlobalArray.from_host");
           nb::gil_scoped_release nogil;
           return GlobalArray::from_host(ctx, t, s);
         },
         arg("host"), arg("sharding"),
         "This device's block of an array every device holds whole (no communication)");
  gv.def("_output",
         [](const GlobalArray& x, const PartitionSpec& spec) {
           spmd::DeviceContext& ctx = current_context("global_map");
           nb::gil_scoped_release nogil;
           Tensor t = g::reshard(x, GlobalSharding{spec}, "global_map output").local();
           // Replicated along an axis but tracked as per-device: make it one value.
           const std::uint32_t extra = t.varying_axes() & ~ctx.axis_mask(spec);
           if (extra) t = spmd::pmean(ctx, t, ctx.axes_of(extra));
           return t;
         },
         arg("x"), arg("spec"), "A global_map output: x resharded to spec, as a local block");

  // Ops: each picks its output's sharding by its rule and inserts the collectives.
  gv.def("matmul", [](const GlobalArray& a, const GlobalArray& b, bool trans_b) {
    return g::matmul(a, b, trans_b);
  }, arg("a"), arg("b"), arg("trans_b") = false, Released());
  for (auto [name, fn] : {std::pair{"relu", +[](const GlobalArray& x) { return g::relu(x); }},
                          {"tanh", +[](const GlobalArray& x) { return g::tanh(x); }},
                          {"exp", +[](const GlobalArray& x) { return g::exp(x); }},
                          {"log", +[](const GlobalArray& x) { return g::log(x); }},
                          {"square", +[](const GlobalArray& x) { return g::square(x); }},
                          {"silu", +[](const GlobalArray& x) { return g::silu(x); }},
                          {"neg", +[](const GlobalArray& x) { return g::neg(x); }}})
    gv.def(name, fn, Released());
  gv.def("gelu", [](const GlobalArray& x, bool approximate) { return g::gelu(x, approximate); },
         arg("x"), arg("approximate") = true, Released());
  gv.def("add", &g::add, Released());
  gv.def("sub", &g::sub, Released());
  gv.def("mul", &g::mul, Released());
  gv.def("div", &g::div, Released());
  gv.def("sum",
         [](const GlobalArray& x, const std::optional<std::vector<int>>& axes, bool keepdims) {
           return axes ? g::sum(x, *axes, keepdims) : g::sum(x);
         },
         arg("x"), arg("axes") = nb::none(), arg("keepdims") = false, Released());
  gv.def("mean",
         [](const GlobalArray& x, const std::optional<std::vector<int>>& axes, bool keepdims) {
           return axes ? g::mean(x, *axes, keepdims) : g::mean(x);
         },
         arg("x"), arg("axes") = nb::none(), arg("keepdims") = false, Released());
  gv.def("softmax", &g::softmax, arg("x"), arg("axis") = -1, Released());
  gv.def("log_softmax", &g::log_softmax, arg("x"), arg("axis") = -1, Released());
  gv.def("layer_norm",
         [](const GlobalArray& x, const GlobalArray& gamma, const GlobalArray& beta, float eps) {
           return g::layer_norm(x, gamma, beta, eps);
         },
         arg("x"), arg("gamma"), arg("beta"), arg("eps") = 1e-5f, Released());
  gv.def("rms_norm", &g::rms_norm, arg("x"), arg("gamma"), arg("eps") = 1e-6f, Released());
  gv.def("embedding", &g::embedding, arg("table"), arg("ids"), Released());
  gv.def("cross_entropy", &g::cross_entropy, arg("logits"), arg("labels"), Released());
  gv.def("reshape", &g::reshape, arg("x"), arg("shape"), Released());
  gv.def("transpose", &g::transpose, arg("x"), arg("d0") = -2, arg("d1") = -1, Released());
  gv.def("permute", &g::permute, arg("x"), arg("perm"), Released());
  gv.def("slice", &g::slice, arg("x"), arg("axis"), arg("start"), arg("end"), Released());
  gv.def("concat", &g::concat, arg("xs"), arg("axis") = 0, Released());
  gv.def("reshard",
         [](const GlobalArray& x, nb::handle target) {
           const GlobalSharding s = sharding_of(target);
           nb::gil_scoped_release nogil;
           return g::reshard(x, s);
         },
         arg("x"), arg("sharding"), "x moved to `sharding` (the collectives it takes)");
  gv.def("with_sharding_constraint",
         [](const GlobalArray& x, nb::handle target) {
           const GlobalSharding s = sharding_of(target);
           nb::gil_scoped_release nogil;
           return g::with_sharding_constraint(x, s);
         },
         arg("x"), arg("sharding"));
  gv.def("replicate", [](const GlobalArray& x) { return g::replicate(x); }, Released());
  gv.def("reshard_bytes",
         [](const GlobalArray& x, nb::handle target) {
           return g::reshard_bytes(x, sharding_of(target));
         },
         arg("x"), arg("sharding"), "The bytes reshard(x, sharding) sends per device");

  gv.def("value_and_grad",
         [](nb::callable fn, const std::map<std::string, GlobalArray>& params) {
           // fn gets the parameters (a dict path -> GlobalArray) and returns a scalar
           // GlobalArray, on the device's tape. The backward pass runs collectives: the lock
           // is released around it, so the other devices' Python can reach theirs.
           g::GlobalLossFn loss = [&fn](const g::GlobalTree& p) {
             nb::gil_scoped_acquire gil;
             nb::object out = fn(nb::cast(p));
             DISTJAX_CHECK(nb::isinstance<GlobalArray>(out), InvalidArgument,
                           "[global_view.value_and_grad] the function must return a "
                           "GlobalArray, got ",
                           nb::cast<std::string>(nb::str(out.type())));
             return nb::cast<GlobalArray>(out);
           };
           nb::gil_scoped_release nogil;
           return g::value_and_grad(loss, params);
         },
         arg("fn"), arg("params"),
         "(loss replicated, gradients with their parameters' shardings) of fn(params)");

  gv.def("_record_plan",
         [](nb::callable fn) {
           g::PlanRecorder recorder;
           nb::object out;
           {
             g::RecordPlan on(recorder);
             out = fn();
           }
           return nb::make_tuple(out, recorder.str());
         },
         arg("fn"), "fn() with the communication plan of this device recorded: (result, plan)");
}

}  // namespace distjax::python
