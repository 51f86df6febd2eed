// The tape's primitives for python/distjax/autodiff.py (value_and_grad, grad, remat over
// trees of tensors): leaves, grad mode, grad of outputs, and rematerialisation of a Python
// function.
#include <nanobind/stl/function.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::python {

namespace {

/// Calls a Python function of tensors returning a tensor or a sequence of them, from a
/// thread that may not hold the interpreter lock (a backward pass runs with it released).
std::vector<Tensor> call_python(const nb::callable& fn, const std::vector<Tensor>& inputs,
                                const char* op) {
  nb::gil_scoped_acquire gil;
  nb::list args;
  for (const Tensor& x : inputs) args.append(nb::cast(x));
  nb::object out = fn(*nb::tuple(args));
  if (nb::isinstance<Tensor>(out)) return {nb::cast<Tensor>(out)};
  DISTJAX_CHECK(nb::isinstance<nb::sequence>(out), InvalidArgument, "[", op,
                "] the function must return a Tensor or a sequence of Tensors, got ",
                nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(out.ptr())))).c_str());
  return nb::cast<std::vector<Tensor>>(out);
}

}  // namespace

void bind_autodiff(nb::module_& m) {
  using nb::arg;
  m.def("_make_leaf", &tensor::make_leaf, arg("x"),
        "A new leaf of the tape sharing x's storage (what value_and_grad differentiates by)");
  m.def("_grad_enabled", &tensor::grad_enabled);
  m.def("_set_grad_enabled", &tensor::set_grad_enabled, arg("on"));
  m.def("_grad",
        [](const std::vector<Tensor>& outputs, std::vector<Tensor> seeds,
           const std::vector<Tensor>& wrt) {
          if (seeds.empty()) seeds.resize(outputs.size());  // ones for scalar outputs
          return autodiff::grad(outputs, seeds, wrt);
        },
        arg("outputs"), arg("seeds"), arg("wrt"), nb::call_guard<nb::gil_scoped_release>(),
        "Cotangents of `wrt` for `outputs` seeded by `seeds` (empty: ones for scalars)");
  m.def("_checkpoint",
        [](nb::callable fn, const std::vector<Tensor>& inputs) {
          // The function lives as long as the tape holds the recomputation, and goes
          // (with the lock) wherever the tape is freed.
          std::shared_ptr<nb::callable> held(new nb::callable(std::move(fn)), [](nb::callable* p) {
            nb::gil_scoped_acquire gil;
            delete p;
          });
          autodiff::RematFn remat = [held](const tensor::TensorTree&,
                                           const std::vector<Tensor>& xs) {
            return call_python(*held, xs, "remat");
          };
          nb::gil_scoped_release nogil;
          return autodiff::checkpoint(remat, tensor::TensorTree(), inputs);
        },
        arg("fn"), arg("inputs"),
        "Runs fn(*inputs) keeping none of its activations; runs it again in the backward pass");
}

}  // namespace distjax::python
