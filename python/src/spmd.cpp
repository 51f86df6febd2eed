// Meshes, partition specs, sharded arrays and shard_map of a Python function, with the
// collectives it calls by axis name (the device context is the calling thread's).
#include <chrono>
#include <mutex>
#include <optional>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/comm/launch_environment.hpp"
#include "distjax/core/error.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/mesh/sharded_array.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::python {

namespace {

using mesh::Axes;
using mesh::Mesh;
using mesh::NamedSharding;
using mesh::PartitionSpec;
using mesh::ShardedArray;
using Released = nb::call_guard<nb::gil_scoped_release>;

thread_local spmd::DeviceContext* t_context = nullptr;

/// A name or a sequence of names: one axis or a set of them.
Axes axes_of(nb::handle h) {
  if (nb::isinstance<nb::str>(h)) return Axes(nb::cast<std::string>(h));
  return Axes(nb::cast<std::vector<std::string>>(h));
}

/// A spec entry: None (replicated), a name, or a tuple of names (one dimension over several).
PartitionSpec::Entry entry_of(nb::handle h) {
  if (h.is_none()) return PartitionSpec::Entry(std::nullopt);
  if (nb::isinstance<nb::str>(h)) return PartitionSpec::Entry(nb::cast<std::string>(h));
  return PartitionSpec::Entry(nb::cast<std::vector<std::string>>(h));
}

/// One spec or a sequence of specs, as a list.
std::vector<PartitionSpec> specs_of(nb::handle h) {
  if (nb::isinstance<PartitionSpec>(h)) return {nb::cast<PartitionSpec>(h)};
  return nb::cast<std::vector<PartitionSpec>>(h);
}

/// Tensors of a function's result: one tensor or a sequence of them.
std::vector<Tensor> tensors_of(nb::handle out, const char* op) {
  if (nb::isinstance<Tensor>(out)) return {nb::cast<Tensor>(out)};
  DISTJAX_CHECK(nb::isinstance<nb::sequence>(out) && !nb::isinstance<nb::str>(out),
                InvalidArgument, "[", op, "] the function must return a Tensor or a tuple of them");
  std::vector<Tensor> v;
  for (nb::handle x : nb::cast<nb::sequence>(out)) {
    DISTJAX_CHECK(nb::isinstance<Tensor>(x), InvalidArgument, "[", op,
                  "] the function must return Tensors, got ",
                  nb::cast<std::string>(nb::str(x.type())));
    v.push_back(nb::cast<Tensor>(x));
  }
  return v;
}

/// The first Python exception a device raised, to raise again in the caller.
struct DeviceFailure {
  std::mutex mu;
  nb::object exception;  // touched with the lock held only
  std::string message;   // the error the device's launch failed with
  int device = -1;
};

/// shard_map of a Python function: f(*arrays) runs fn(*locals) on every device.
class PyShardMapped {
 public:
  PyShardMapped(nb::callable fn, Mesh mesh, std::vector<PartitionSpec> in_specs,
                std::vector<PartitionSpec> out_specs, bool single_output,
                spmd::ShardMapOptions options)
      : fn_(std::make_shared<nb::callable>(std::move(fn))),
        mesh_(std::move(mesh)),
        in_specs_(std::move(in_specs)),
        out_specs_(std::move(out_specs)),
        single_output_(single_output),
        options_(std::move(options)) {}

  nb::object call(nb::args args) const {
    DISTJAX_CHECK(args.size() == in_specs_.size(), InvalidArgument, "[shard_map] ",
                  args.size(), " arguments for ", in_specs_.size(), " in_specs");
    std::vector<ShardedArray> inputs;
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (nb::isinstance<ShardedArray>(args[i])) {
        inputs.push_back(nb::cast<ShardedArray>(args[i]));
      } else {
        Tensor host = tensor_from_object(args[i], false);
        nb::gil_scoped_release nogil;
        inputs.push_back(mesh::device_put(host, NamedSharding(mesh_, in_specs_[i]),
                                          "argument " + std::to_string(i)));
      }
    }
    auto failure = std::make_shared<DeviceFailure>();
    std::shared_ptr<nb::callable> fn = fn_;
    spmd::ShardMapFn body = [fn, failure](spmd::DeviceContext& ctx,
                                          const std::vector<Tensor>& locals) {
      ContextScope scope(ctx);
      nb::gil_scoped_acquire gil;
      try {
        nb::list xs;
        for (const Tensor& x : locals) xs.append(nb::cast(x));
        nb::object out = (*fn)(*nb::tuple(xs));
        return tensors_of(out, "shard_map");
      } catch (nb::python_error& e) {
        // "ValueError: what it said" (the traceback stays with the exception object).
        const std::string message =
            "[shard_map] device " + std::to_string(ctx.device()) + " raised " +
            nb::cast<std::string>(nb::handle(e.type()).attr("__name__")) + ": " +
            nb::cast<std::string>(nb::str(e.value()));
        {
          std::lock_guard<std::mutex> lock(failure->mu);
          if (!failure->exception.is_valid()) {
            failure->exception = nb::borrow(e.value());
            failure->message = message;
            failure->device = ctx.device();
          }
        }
        throw Error(message);
      }
    };
    std::vector<ShardedArray> outputs;
    try {
      spmd::ShardMapped mapped = spmd::shard_map(mesh_, body, in_specs_, out_specs_, options_);
      nb::gil_scoped_release nogil;
      outputs = mapped(inputs);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(failure->mu);
      // The launch fails with the first error of any device: when that is a Python
      // exception of the function (not a DistJax error of one device that the others then
      // see as a CommError in their Python code), raise that exception object itself.
      if (failure->exception.is_valid() &&
          std::string_view(e.what()).find(failure->message) != std::string_view::npos) {
        // The device's own exception, with a note of where it was raised.
        nb::object exc = failure->exception;
        if (nb::hasattr(exc, "add_note"))
          exc.attr("add_note")("raised on device " + std::to_string(failure->device) +
                               " of the mesh " + mesh_.to_string() +
                               " inside shard_map; every device stopped");
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
        throw nb::python_error();
      }
      throw;
    }
    if (single_output_) return nb::cast(outputs.at(0));
    nb::list l;
    for (auto& o : outputs) l.append(nb::cast(o));
    return nb::tuple(l);
  }

 private:
  std::shared_ptr<nb::callable> fn_;
  Mesh mesh_;
  std::vector<PartitionSpec> in_specs_, out_specs_;
  bool single_output_;
  spmd::ShardMapOptions options_;
};

}  // namespace

spmd::DeviceContext& current_context(const char* op) {
  DISTJAX_CHECK(t_context != nullptr, ShardingError, "[", op,
                "] called outside shard_map: collectives run on the devices of a shard_map");
  return *t_context;
}

ContextScope::ContextScope(spmd::DeviceContext& ctx) : prev_(t_context) {
  t_context = &ctx;
}
ContextScope::~ContextScope() {
  t_context = prev_;
}

void bind_spmd(nb::module_& m) {
  using nb::arg;
  nb::class_<Mesh>(m, "Mesh", "Devices arranged in a grid with named axes")
      .def(nb::init<std::vector<int>, std::vector<std::string>>(), arg("shape"), arg("axis_names"))
      .def_prop_ro("shape", &Mesh::shape)
      .def_prop_ro("axis_names", &Mesh::axis_names)
      .def_prop_ro("size", &Mesh::size)
      .def("axis_size", [](const Mesh& m, const std::string& a) { return m.axis_size(a); })
      .def("__repr__", &Mesh::to_string);

  nb::class_<PartitionSpec>(m, "PartitionSpec",
                            "How each dimension splits over mesh axes: P('data', None)")
      .def("__init__",
           [](PartitionSpec* self, nb::args entries) {
             std::vector<PartitionSpec::Entry> es;
             for (nb::handle h : entries) es.push_back(entry_of(h));
             new (self) PartitionSpec(PartitionSpec::from_entries(std::move(es)));
           })
      .def("__len__", &PartitionSpec::size)
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; })
      .def("__repr__", &PartitionSpec::to_string);

  nb::class_<NamedSharding>(m, "NamedSharding", "A partition spec over a mesh")
      .def(nb::init<Mesh, PartitionSpec>(), arg("mesh"), arg("spec"))
      .def_prop_ro("mesh", &NamedSharding::mesh)
      .def_prop_ro("spec", &NamedSharding::spec)
      .def("shard_shape", &NamedSharding::shard_shape)
      .def("__repr__", &NamedSharding::to_string);

  nb::class_<ShardedArray>(m, "ShardedArray", "A global array as one shard per device")
      .def_prop_ro("shape", &ShardedArray::shape)
      .def_prop_ro("dtype", &ShardedArray::dtype)
      .def_prop_ro("sharding", &ShardedArray::sharding)
      .def_prop_ro("shards", &ShardedArray::shards)
      .def("gather", &mesh::gather, Released(), "The global array as one tensor")
      .def("__repr__", &ShardedArray::str);

  m.def("device_put",
        [](nb::handle x, const NamedSharding& s) {
          Tensor host = tensor_from_object(x, false);
          nb::gil_scoped_release nogil;
          return mesh::device_put(host, s);
        },
        arg("x"), arg("sharding"), "Splits a host array into the shards of `sharding`");

  nb::class_<PyShardMapped>(m, "_ShardMapped")
      .def("__call__", &PyShardMapped::call);
  m.def("shard_map",
        [](nb::callable fn, const Mesh& mesh, nb::handle in_specs, nb::handle out_specs,
           double timeout_s, bool check_replicated, int intra_op_threads,
           const std::string& backend) {
          spmd::ShardMapOptions o;
          if (backend == "auto") {
            o.backend = comm::default_backend(comm::discover_launch_environment());
          } else {
            const std::optional<comm::Backend> b = comm::backend_from_name(backend);
            DISTJAX_CHECK(b.has_value(), InvalidArgument, "[shard_map] backend \"", backend,
                          "\" is none of \"auto\", \"threads\", \"mpi\", \"nccl\"");
            o.backend = *b;
          }
          o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
          o.check_replicated = check_replicated;
          o.intra_op_threads = intra_op_threads;
          return PyShardMapped(std::move(fn), mesh, specs_of(in_specs), specs_of(out_specs),
                               nb::isinstance<PartitionSpec>(out_specs), o);
        },
        arg("fn"), arg("mesh"), arg("in_specs"), arg("out_specs"), arg("timeout_s") = 30.0,
        arg("check_replicated") = false, arg("intra_op_threads") = 0, arg("backend") = "auto",
        "Runs fn once per device of `mesh` on its local shards (SPMD)");

  // Collectives, by axis name, inside shard_map.
  auto collective = [&](const char* name, auto op) {
    m.def(name, [name, op](const Tensor& x, nb::handle axes) {
      Axes a = axes_of(axes);
      spmd::DeviceContext& ctx = current_context(name);
      nb::gil_scoped_release nogil;
      return op(ctx, x, a);
    }, arg("x"), arg("axis_name"));
  };
  collective("psum", [](auto& c, const Tensor& x, const Axes& a) { return spmd::psum(c, x, a); });
  collective("pmean", [](auto& c, const Tensor& x, const Axes& a) { return spmd::pmean(c, x, a); });
  collective("pmax", [](auto& c, const Tensor& x, const Axes& a) { return spmd::pmax(c, x, a); });
  collective("pvary", [](auto& c, const Tensor& x, const Axes& a) { return spmd::pvary(c, x, a); });
  auto tiled_collective = [&](const char* name, auto op) {
    m.def(name, [name, op](const Tensor& x, nb::handle axes, int axis, bool tiled) {
      Axes a = axes_of(axes);
      spmd::DeviceContext& ctx = current_context(name);
      nb::gil_scoped_release nogil;
      return op(ctx, x, a, axis, tiled);
    }, arg("x"), arg("axis_name"), arg("axis") = 0, arg("tiled") = false);
  };
  tiled_collective("all_gather", [](auto& c, const Tensor& x, const Axes& a, int d, bool t) {
    return spmd::all_gather(c, x, a, d, t);
  });
  tiled_collective("all_gather_invariant", [](auto& c, const Tensor& x, const Axes& a, int d,
                                              bool t) {
    return spmd::all_gather_invariant(c, x, a, d, t);
  });
  tiled_collective("psum_scatter", [](auto& c, const Tensor& x, const Axes& a, int d, bool t) {
    return spmd::psum_scatter(c, x, a, d, t);
  });
  m.def("all_to_all",
        [](const Tensor& x, nb::handle axes, int split_axis, int concat_axis) {
          Axes a = axes_of(axes);
          spmd::DeviceContext& ctx = current_context("all_to_all");
          nb::gil_scoped_release nogil;
          return spmd::all_to_all(ctx, x, a, split_axis, concat_axis);
        },
        arg("x"), arg("axis_name"), arg("split_axis"), arg("concat_axis"));
  m.def("ppermute",
        [](const Tensor& x, nb::handle axes, const std::vector<std::pair<int, int>>& perm) {
          Axes a = axes_of(axes);
          spmd::DeviceContext& ctx = current_context("ppermute");
          nb::gil_scoped_release nogil;
          return spmd::ppermute(ctx, x, a, perm);
        },
        arg("x"), arg("axis_name"), arg("perm"));
  m.def("axis_index", [](nb::handle axes) {
    return spmd::axis_index(current_context("axis_index"), axes_of(axes));
  }, arg("axis_name"));
  m.def("axis_size", [](nb::handle axes) {
    return spmd::axis_size(current_context("axis_size"), axes_of(axes));
  }, arg("axis_name"));
}

}  // namespace distjax::python
