// DistJax's errors as Python exceptions of the same names, carrying the same messages:
// distjax.Error (a RuntimeError) and its kinds; InvalidArgument is also a ValueError.
#include "bindings.hpp"

#include "distjax/core/error.hpp"

namespace distjax::python {

void bind_errors(nb::module_& m) {
  // Registered base first: nanobind tries the translators last registered first, so each
  // kind is caught before the base it derives from.
  auto error = nb::exception<distjax::Error>(m, "Error", PyExc_RuntimeError);
  nb::object base = error;
  // A kind that is also a ValueError / OSError, as Python code expects of bad arguments and
  // unreadable files: its Python class derives from both.
  auto kind = [&](const char* name, PyObject* also) {
    nb::object bases = also ? nb::make_tuple(base, nb::handle(also)) : nb::make_tuple(base);
    nb::object cls = nb::steal(PyErr_NewException(
        (std::string("distjax.") + name).c_str(), bases.ptr(), nullptr));
    m.attr(name) = cls;
    return cls.release().ptr();  // held for the process's life (no destructor at exit)
  };
  static PyObject* invalid = kind("InvalidArgument", PyExc_ValueError);
  static PyObject* sharding = kind("ShardingError", nullptr);
  static PyObject* comm = kind("CommError", nullptr);
  static PyObject* config = kind("ConfigError", PyExc_ValueError);
  static PyObject* not_implemented = kind("NotImplemented", PyExc_NotImplementedError);
  static PyObject* io = kind("IoError", PyExc_OSError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const distjax::InvalidArgument& e) {
      PyErr_SetString(invalid, e.what());
    } catch (const distjax::ShardingError& e) {
      PyErr_SetString(sharding, e.what());
    } catch (const distjax::CommError& e) {
      PyErr_SetString(comm, e.what());
    } catch (const distjax::ConfigError& e) {
      PyErr_SetString(config, e.what());
    } catch (const distjax::NotImplemented& e) {
      PyErr_SetString(not_implemented, e.what());
    } catch (const distjax::IoError& e) {
      PyErr_SetString(io, e.what());
    }
  });
}

}  // namespace distjax::python
