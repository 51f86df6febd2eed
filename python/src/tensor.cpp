// distjax.Tensor: NumPy and DLPack both ways without a copy, and the tensor's own methods.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::python {

namespace {

namespace dl = nb::dlpack;

dl::dtype dlpack_dtype(DType t, bool bf16_as_uint16) {
  switch (t) {
    case DType::F32: return nb::dtype<float>();
    case DType::F16: return {static_cast<std::uint8_t>(dl::dtype_code::Float), 16, 1};
    case DType::BF16:
      if (bf16_as_uint16) return nb::dtype<std::uint16_t>();
      return {static_cast<std::uint8_t>(dl::dtype_code::Bfloat), 16, 1};
    case DType::I32: return nb::dtype<std::int32_t>();
    case DType::I64: return nb::dtype<std::int64_t>();
    case DType::F64: break;
  }
  throw InvalidArgument("[distjax] a tensor cannot hold f64");
}

DType distjax_dtype(dl::dtype d, bool as_bf16) {
  const auto code = static_cast<dl::dtype_code>(d.code);
  if (d.lanes == 1) {
    if (as_bf16 && d.bits == 16 && (code == dl::dtype_code::UInt || code == dl::dtype_code::Int))
      return DType::BF16;
    if (code == dl::dtype_code::Float && d.bits == 32) return DType::F32;
    if (code == dl::dtype_code::Float && d.bits == 16) return DType::F16;
    if (code == dl::dtype_code::Bfloat && d.bits == 16) return DType::BF16;
    if (code == dl::dtype_code::Int && d.bits == 32) return DType::I32;
    if (code == dl::dtype_code::Int && d.bits == 64) return DType::I64;
  }
  const char* kind = code == dl::dtype_code::Float   ? "float"
                     : code == dl::dtype_code::Int   ? "int"
                     : code == dl::dtype_code::UInt  ? "uint"
                     : code == dl::dtype_code::Bool  ? "bool"
                     : code == dl::dtype_code::Complex ? "complex"
                                                       : "other";
  throw InvalidArgument("[distjax] arrays of " + std::string(kind) + std::to_string(d.bits) +
                        " have no tensor dtype: DistJax holds float32, bfloat16, float16, "
                        "int32 and int64 (convert first, e.g. astype(numpy.float32))");
}

/// The tensor as an ndarray of nanobind (DLPack export, buffer protocol) over its memory:
/// the ndarray owns a copy of the tensor handle, so the storage lives as long as it does.
template <class Framework>
nb::ndarray<Framework> as_ndarray(const Tensor& t, bool bf16_as_uint16) {
  check_defined(t, "Tensor.numpy", "self");
  DISTJAX_CHECK(t.device().kind == DeviceKind::CPU, NotImplemented,
                "[distjax] a tensor on ", t.device().str(),
                " is exported through DLPack from a CPU build only for now; call .to('cpu') first");
  auto* keep = new Tensor(t.detach());
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  return nb::ndarray<Framework>(t.raw_data(), shape.size(), shape.data(), owner, nullptr,
                                dlpack_dtype(t.dtype(), bf16_as_uint16), nb::device::cpu::value);
}

/// Whether an array's elements lie in row-major order without gaps (dimensions of size 1
/// may have any stride).
bool row_major(const nb::ndarray<>& a) {
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) == 1) continue;
    if (a.stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

/// x[index]: integers and slices of step 1 per leading dimension (a tuple for several),
/// differentiable (tensor::slice, then a reshape dropping the integer-indexed dimensions).
Tensor index(const Tensor& x, nb::handle key) {
  std::vector<nb::handle> parts;
  if (nb::isinstance<nb::tuple>(key))
    for (nb::handle h : nb::cast<nb::tuple>(key)) parts.push_back(h);
  else
    parts.push_back(key);
  DISTJAX_CHECK(static_cast<int>(parts.size()) <= x.rank(), InvalidArgument, "[Tensor[]] ",
                parts.size(), " indices for a tensor of rank ", x.rank());
  Tensor out = x;
  Shape kept;
  for (int d = 0; d < x.rank(); ++d) {
    const std::int64_t n = x.size(d);
    if (d >= static_cast<int>(parts.size())) {
      kept.push_back(n);
      continue;
    }
    nb::handle k = parts[static_cast<std::size_t>(d)];
    if (PyLong_Check(k.ptr())) {
      std::int64_t i = nb::cast<std::int64_t>(k);
      if (i < 0) i += n;
      DISTJAX_CHECK(i >= 0 && i < n, InvalidArgument, "[Tensor[]] index ", nb::cast<std::int64_t>(k),
                    " out of range for dimension ", d, " of size ", n);
      out = tensor::slice(out, d, i, i + 1);
    } else if (PySlice_Check(k.ptr())) {
      Py_ssize_t start = 0, stop = 0, step = 0;
      DISTJAX_CHECK(PySlice_Unpack(k.ptr(), &start, &stop, &step) == 0, InvalidArgument,
                    "[Tensor[]] a bad slice");
      DISTJAX_CHECK(step == 1, NotImplemented, "[Tensor[]] slices of step ", step,
                    " (only step 1 for now)");
      PySlice_AdjustIndices(static_cast<Py_ssize_t>(n), &start, &stop, step);
      out = tensor::slice(out, d, start, std::max(start, stop));
      kept.push_back(std::max<std::int64_t>(0, stop - start));
    } else {
      throw InvalidArgument("[Tensor[]] indices are integers and slices, got " +
                            nb::cast<std::string>(nb::str(k.type())));
    }
  }
  return kept.size() == static_cast<std::size_t>(x.rank()) ? out : tensor::reshape(out, kept);
}

/// A Tensor of an operand: itself, or distjax.asarray of a NumPy array, a DLPack tensor or
/// a Python sequence.
Tensor operand(nb::handle h) {
  if (nb::isinstance<Tensor>(h)) return nb::cast<Tensor>(h);
  return nb::cast<Tensor>(nb::module_::import_("distjax").attr("asarray")(h));
}

bool is_number(nb::handle h) {
  return (PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr())) && !PyBool_Check(h.ptr());
}

/// A binary operator of Tensor: with a tensor or an array (broadcasting), or with a Python
/// number (the scalar op: `scalar(x, s)`); `reflected` for x.__rop__(other).
template <class Op, class Scalar>
void def_operator(nb::class_<Tensor>& cls, const char* name, Op op, Scalar scalar,
                  bool reflected) {
  cls.def(name, [op, scalar, reflected](const Tensor& x, nb::handle other) {
    if (is_number(other)) {
      const double s = nb::cast<double>(other);
      nb::gil_scoped_release nogil;
      return scalar(x, s);
    }
    const Tensor y = operand(other);
    nb::gil_scoped_release nogil;
    return reflected ? op(y, x) : op(x, y);
  });
}

/// The NumPy array over a tensor's memory (no copy; bf16 as ml_dtypes.bfloat16 when it is
/// installed, else as uint16).
nb::object numpy_of(const Tensor& t) {
  nb::object a = nb::cast(as_ndarray<nb::numpy>(t, true));
  if (t.dtype() == DType::BF16) {
    try {
      a = a.attr("view")(nb::module_::import_("ml_dtypes").attr("bfloat16"));
    } catch (nb::python_error&) {  // no ml_dtypes: the 16-bit words
    }
  }
  return a;
}

}  // namespace

Tensor tensor_from_object(nb::handle obj, bool as_bf16) {
  if (nb::isinstance<Tensor>(obj)) return nb::cast<Tensor>(obj);
  // One import (a DLPack capsule can be consumed once): CPU memory in row-major order
  // comes in as it is; a strided NumPy array is copied into a contiguous one first (the
  // tensor then owns that copy).
  using Array = nb::ndarray<nb::device::cpu>;
  nb::ndarray<> any = nb::cast<nb::ndarray<>>(obj);
  if (any.device_type() != nb::device::cpu::value)
    throw NotImplemented("[distjax] an array on a device other than the CPU (DLPack device type " +
                         std::to_string(any.device_type()) +
                         ") is not imported yet: copy it to the CPU first");
  Array array = row_major(any) ? Array(any)
                               : Array(nb::cast<nb::ndarray<nb::c_contig, nb::device::cpu>>(obj));
  const DType dtype = distjax_dtype(array.dtype(), as_bf16);
  Shape shape(array.ndim());
  for (std::size_t i = 0; i < array.ndim(); ++i) shape[i] = static_cast<std::int64_t>(array.shape(i));
  // The ndarray keeps the exporter's buffer alive; releasing it needs the interpreter lock,
  // and the last tensor may go on any thread (a simulated device, inside a kernel).
  auto* keep = new Array(std::move(array));
  return Tensor::from_blob(keep->data(), shape, dtype, Device::cpu(), [keep] {
    if (!Py_IsInitialized()) return;  // after the interpreter: leave it to the OS
    nb::gil_scoped_acquire gil;
    delete keep;
  });
}

void bind_tensor(nb::module_& m) {
  nb::enum_<DType>(m, "DType")
      .value("float32", DType::F32)
      .value("bfloat16", DType::BF16)
      .value("float16", DType::F16)
      .value("int32", DType::I32)
      .value("int64", DType::I64);
  m.def("_dtype_name", [](DType t) { return std::string(dtype_name(t)); });

  nb::class_<Tensor> cls(m, "Tensor",
                         "An n-dimensional array of DistJax (shared storage; ops return new "
                         "tensors)");
  cls      .def_prop_ro("shape",
                   [](const Tensor& t) {
                     nb::list l;
                     for (auto d : t.shape()) l.append(d);
                     return nb::tuple(l);
                   })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("ndim", &Tensor::rank)
      .def_prop_ro("size", &Tensor::numel)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("device", [](const Tensor& t) { return t.device().str(); })
      .def_prop_ro("requires_grad", &Tensor::requires_grad)
      .def_prop_ro("data_ptr", [](const Tensor& t) {
        return reinterpret_cast<std::uintptr_t>(t.defined() ? t.raw_data() : nullptr);
      }, "The address of the first element (what a zero-copy exchange keeps)")
      .def_prop_ro("varying_axes", &Tensor::varying_axes)
      .def("__len__", [](const Tensor& t) {
        DISTJAX_CHECK(t.rank() > 0, InvalidArgument, "[distjax] len() of a 0-d tensor");
        return t.size(0);
      })
      .def("numpy", &numpy_of, "The NumPy array over this tensor's memory (no copy)")
      .def("__array__",
           [](const Tensor& t, nb::handle dtype, nb::handle copy) {
             nb::object a = numpy_of(t);
             return dtype.is_none() ? a : a.attr("astype")(dtype);
           },
           nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("tolist", [](const Tensor& t) { return numpy_of(t).attr("tolist")(); })
      .def("__dlpack__",
           [](const Tensor& t, nb::kwargs kwargs) {
             nb::object nd = nb::cast(as_ndarray<nb::array_api>(t, false));
             return nd.attr("__dlpack__")(**kwargs);
           })
      .def("__dlpack_device__",
           [](const Tensor& t) {
             const bool cpu = t.device().kind == DeviceKind::CPU;
             return nb::make_tuple(cpu ? 1 : 2, cpu ? 0 : t.device().index);
           })
      .def("item", [](const Tensor& t) -> nb::object {
        const bool integer = t.dtype() == DType::I32 || t.dtype() == DType::I64;
        std::int64_t i = 0;
        double d = 0;
        {
          nb::gil_scoped_release nogil;
          if (integer) i = t.item<std::int64_t>();
          else d = t.item<double>();
        }
        if (integer) return nb::int_(i);
        return nb::float_(d);
      })
      .def("detach", &Tensor::detach)
      .def("clone", &Tensor::clone, nb::call_guard<nb::gil_scoped_release>())
      .def("__repr__", [](const Tensor& t) { return t.str(); })
      .def("astype", &tensor::astype, nb::call_guard<nb::gil_scoped_release>())
      .def("reshape",
           [](const Tensor& t, nb::args shape) {
             Shape s = shape.size() == 1 && !PyLong_Check(shape[0].ptr())
                           ? nb::cast<Shape>(shape[0])
                           : nb::cast<Shape>(shape);
             nb::gil_scoped_release nogil;
             return tensor::reshape(t, s);
           })
      .def_prop_ro("T", [](const Tensor& t) { return tensor::transpose(t); })
      .def("__getitem__", &index)
      .def("sum",
           [](const Tensor& t, const std::optional<std::vector<int>>& axes, bool keepdims) {
             nb::gil_scoped_release nogil;
             return axes ? tensor::sum(t, *axes, keepdims) : tensor::sum(t);
           },
           nb::arg("axes") = nb::none(), nb::arg("keepdims") = false)
      .def("mean",
           [](const Tensor& t, const std::optional<std::vector<int>>& axes, bool keepdims) {
             nb::gil_scoped_release nogil;
             return axes ? tensor::mean(t, *axes, keepdims) : tensor::mean(t);
           },
           nb::arg("axes") = nb::none(), nb::arg("keepdims") = false)
      .def("__neg__", &tensor::neg, nb::call_guard<nb::gil_scoped_release>())
      .def("__pow__", [](const Tensor& t, double p) {
        nb::gil_scoped_release nogil;
        return tensor::pow_scalar(t, p);
      });
  // NumPy leaves `array op tensor` to the tensor's reflected operator (a Tensor result).
  cls.attr("__array_ufunc__") = nb::none();
  namespace t = tensor;
  auto add_s = [](const Tensor& x, double s) { return t::add_scalar(x, s); };
  auto mul_s = [](const Tensor& x, double s) { return t::mul_scalar(x, s); };
  auto add = [](const Tensor& a, const Tensor& b) { return t::add(a, b); };
  auto sub = [](const Tensor& a, const Tensor& b) { return t::sub(a, b); };
  auto mul = [](const Tensor& a, const Tensor& b) { return t::mul(a, b); };
  auto div = [](const Tensor& a, const Tensor& b) { return t::div(a, b); };
  auto matmul = [](const Tensor& a, const Tensor& b) { return t::matmul(a, b); };
  def_operator(cls, "__add__", add, add_s, false);
  def_operator(cls, "__radd__", add, add_s, true);
  def_operator(cls, "__sub__", sub, [](const Tensor& x, double s) { return t::add_scalar(x, -s); },
               false);
  def_operator(cls, "__rsub__", sub,
               [](const Tensor& x, double s) { return t::add_scalar(t::neg(x), s); }, true);
  def_operator(cls, "__mul__", mul, mul_s, false);
  def_operator(cls, "__rmul__", mul, mul_s, true);
  def_operator(cls, "__truediv__", div,
               [](const Tensor& x, double s) { return t::mul_scalar(x, 1.0 / s); }, false);
  def_operator(cls, "__rtruediv__", div,
               [](const Tensor& x, double s) { return t::mul_scalar(t::pow_scalar(x, -1.0), s); },
               true);
  // A number is no matrix: matmul with one is the tensor's error, as for a 0-d tensor.
  auto no_scalar = [](const Tensor& x, double s) { return t::matmul(x, Tensor::scalar(s)); };
  def_operator(cls, "__matmul__", matmul, no_scalar, false);
  def_operator(cls, "__rmatmul__", matmul, no_scalar, true);

  m.def("_from_object", &tensor_from_object, nb::arg("obj"), nb::arg("as_bf16") = false);
}

}  // namespace distjax::python
