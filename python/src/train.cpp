// Configs, training, plans and checkpoints from Python: the same calls `distjax train`,
// `distjax plan` and `distjax ckpt inspect` make.
#include <csignal>
#include <sstream>

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/app/run.hpp"
#include "distjax/app/train.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/core/error.hpp"
#include "distjax/plan/plan.hpp"
#include "distjax/train/checkpoint.hpp"

namespace distjax::python {

namespace {

/// A config and the file it came from (what its errors name).
struct Config {
  config::TrainConfig config;
  std::string source;
};

/// Every tensor of the checkpoint at `path`, as global arrays on the CPU ("params/<path>",
/// "opt_state/<slot>/<path>"), whatever the mesh it was saved on.
std::map<std::string, Tensor> load_checkpoint_arrays(const std::string& path) {
  const std::optional<std::string> dir = train::find_checkpoint(path);
  DISTJAX_CHECK(dir.has_value(), IoError, "[checkpoint.load] no checkpoint in \"", path, "\"");
  const train::CheckpointIndex index = train::read_checkpoint_index(*dir);
  train::TrainState state;
  for (const train::CheckpointTensor& t : index.tensors) {
    const Tensor zeros = Tensor::zeros(t.shape, t.dtype, Device::cpu());
    if (t.name.rfind("params/", 0) == 0) state.params.set(t.name.substr(7), zeros);
    else if (t.name.rfind("opt_state/", 0) == 0) state.opt_state.set(t.name.substr(10), zeros);
    else
      throw IoError("[checkpoint.load] \"" + *dir + "\": tensor \"" + t.name +
                    "\" is neither params/ nor opt_state/");
  }
  train::load_checkpoint(*dir, state, train::CheckpointLayout{});
  std::map<std::string, Tensor> out;
  for (const auto& [p, t] : state.params) out["params/" + p] = t;
  for (const auto& [p, t] : state.opt_state) out["opt_state/" + p] = t;
  return out;
}

}  // namespace

void bind_train(nb::module_& m) {
  using nb::arg;
  using Released = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<Config>(m, "Config", "A training config (configs/*.toml), as `distjax train` reads it")
      .def_ro("source", &Config::source)
      .def("set",
           [](Config& c, const std::string& assignment) {
             config::apply_override(c.config, assignment);
           },
           arg("assignment"), "Applies one override \"table.key=value\" (as --set does)")
      .def("to_toml", [](const Config& c) { return config::to_toml(c.config); })
      .def("validate", [](const Config& c) { c.config.validate(c.source); })
      .def_prop_ro("out_dir", [](const Config& c) { return c.config.run.out_dir; })
      .def_prop_ro("notices", [](const Config& c) { return c.config.notices; });

  m.def("load_config",
        [](const std::string& path, const std::vector<std::string>& overrides) {
          return Config{config::load_config(path, overrides), path};
        },
        arg("path"), arg("overrides") = std::vector<std::string>{},
        "The config at `path` with `overrides` (\"table.key=value\") applied; errors name the "
        "file, line and key");
  m.def("builtin_config",
        [](const std::string& name) { return Config{app::builtin_config(name), name}; },
        arg("name"), "A config of configs/ as built into the library (\"gpt_tiny\", ...)");
  m.def("builtin_configs", &app::builtin_configs);

  m.def("_train",
        [](const Config& c, bool show_schedule, bool show_sharding) {
          // Ctrl-C while the run holds no interpreter lock: Python's own handler would only
          // note it for later, so ours asks the run to stop after its step (the devices save
          // their checkpoint and summary), and KeyboardInterrupt is raised when it returns;
          // a second Ctrl-C kills the process.
          app::clear_stop_request();
          struct sigaction stop{}, previous{};
          stop.sa_handler = [](int) {
            if (!app::stop_requested()) return app::request_stop();
            std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
            std::raise(SIGINT);
          };
          sigemptyset(&stop.sa_mask);
          sigaction(SIGINT, &stop, &previous);
          int status = 0;
          try {
            nb::gil_scoped_release nogil;
            status = app::train(c.config, c.source,
                                {.show_schedule = show_schedule,
                                 .show_sharding = show_sharding,
                                 .stoppable = true});
          } catch (...) {
            sigaction(SIGINT, &previous, nullptr);
            throw;
          }
          sigaction(SIGINT, &previous, nullptr);
          if (status == app::kStoppedStatus) {
            app::clear_stop_request();
            PyErr_SetString(PyExc_KeyboardInterrupt,
                            "training stopped by Ctrl-C after the current step: the checkpoint "
                            "and summary.json hold the steps done");
            throw nb::python_error();
          }
          return status;
        },
        arg("config"), arg("show_schedule") = false, arg("show_sharding") = false);

  m.def("plan",
        [](const Config& c) {
          config::TrainConfig t = c.config;
          t.distributed = config::resolve(t.distributed, comm::LaunchEnvironment{});
          t.validate(c.source);
          return plan::make_plan(plan::model_from_config(t), plan::setup_from_config(t)).str();
        },
        arg("config"), Released(),
        "The per-device memory and communication `distjax plan` predicts, as its text");

  m.def("_checkpoint_load", &load_checkpoint_arrays, arg("path"), Released());
  m.def("_checkpoint_inspect",
        [](const std::string& path) {
          std::ostringstream os;
          train::inspect_checkpoint(path, os);
          return os.str();
        },
        arg("path"), Released());
}

}  // namespace distjax::python
