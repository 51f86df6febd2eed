// app::train: the one path from a config to a trained model, for every registered model.
// The registry of models is here too.
#include "distjax/app/train.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "distjax/app/detail/builtin_models.hpp"
#include "distjax/app/detail/loop.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/core/error.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

namespace {

struct Registry {
  std::mutex mu;
  std::vector<ModelSpec> models = detail::builtin_models();
};

Registry& registry() {
  static Registry r;
  return r;
}

// "1,234,567": counts read at a glance.
std::string grouped(std::int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

bool on_pipeline(const config::TrainConfig& c, const mesh::Mesh& mesh, const Network& network) {
  if (!c.distributed.enabled || !mesh.has_axis("pipe")) return false;
  return mesh.axis_size("pipe") > 1 || !network.init;
}

// The mesh and how the parallelisms split the work over it, the pipeline's schedule, and
// the model's own lines: printed once, by the main process, before the devices run.
void print_header(const config::TrainConfig& c, const mesh::Mesh& mesh, bool piped,
                  const Model& model, const TrainOptions& options) {
  const nn::Precision precision = precision_of(c);
  if (!c.distributed.enabled) {
    std::printf("One device (%s), no mesh; precision %s\n", c.distributed.placement().str().c_str(),
                precision.str().c_str());
  } else {
    std::string how = backend_label(c) + " backend";
    if (mesh.has_axis("model") && mesh.axis_size("model") > 1) {
      how += ", tensor parallel layout " + parallel::describe(tensor_parallel_of(c, mesh));
    }
    switch (c.parallelism.shard) {
      case config::Shard::Optimizer:
        how += ", optimizer state sharded over \"data\" (ZeRO-1)";
        break;
      case config::Shard::Gradients:
        how += ", gradients and optimizer state sharded over \"data\" (ZeRO-2)";
        break;
      case config::Shard::Parameters:
        how += ", parameters fully sharded over \"data\"";
        break;
      case config::Shard::None:
        break;
    }
    std::printf("Mesh (%s, precision %s):\n%s\n", how.c_str(), precision.str().c_str(),
                mesh.to_string().c_str());
  }
  if (piped) {
    const int stages = mesh.axis_size("pipe"), v = static_cast<int>(c.parallelism.virtual_stages);
    const int m = static_cast<int>(c.parallelism.microbatches);
    const parallel::PipelineSchedule schedule = parallel::make_schedule(
        parallel::parse_schedule_kind(c.parallelism.schedule), stages, m, v);
    const parallel::ScheduleReport report = parallel::check_schedule(schedule);
    std::printf(
        "Pipeline: %s over %d stages x %d chunks, %d micro-batches per step; bubble "
        "%.1f%% in theory\n",
        c.parallelism.schedule.c_str(), stages, v, m, 100.0 * report.bubble_fraction);
    if (options.show_schedule)
      std::printf("%s", parallel::format_timeline(schedule, report).c_str());
  }
  for (const std::string& line : model.header)
    std::printf("%s\n", line.c_str());
}

// The model's size on device 0, once its state exists.
void print_model_line(const config::TrainConfig& c, const Model& model, Composed& composed,
                      const train::TrainState& state, std::int64_t steps) {
  std::string where;
  if (composed.pipeline() != nullptr) {
    where = " (stage 0 of " + std::to_string(composed.pipeline()->num_stages()) + ")";
  } else {
    std::size_t split = 0;
    for (const auto& [path, spec] : composed.specs())
      if (spec.size() > 0) ++split;
    if (split > 0)
      where = "; " + std::to_string(split) + " of " + std::to_string(state.params.size()) +
              " tensors split over the mesh";
  }
  const int replicas = composed.data_parallel_size();
  std::string batch = grouped(c.run.batch_size);
  if (replicas > 1)
    batch +=
        " = " + std::to_string(replicas) + " replicas x " + grouped(c.run.batch_size / replicas);
  std::printf("%s: %s parameters, %s on device 0%s | %s steps, global batch %s\n",
              model.description.c_str(), grouped(model.num_parameters).c_str(),
              grouped(state.params.num_elements()).c_str(), where.c_str(), grouped(steps).c_str(),
              batch.c_str());
}

// run.timeline of a pipelined run: the spans of every action of the last step, as a
// Chrome trace (threads: every device's trace is here; MPI: this process's device only).
void write_pipeline_timeline(const config::TrainConfig& c,
                             const std::vector<parallel::PipelineTrace>& traces) {
  std::vector<parallel::PipelineTrace> mine;
  std::vector<int> devices;
  for (std::size_t d = 0; d < traces.size(); ++d)
    if (traces[d].end > traces[d].start) {
      mine.push_back(traces[d]);
      devices.push_back(static_cast<int>(d));
    }
  if (mine.empty()) return;
  const std::string name = devices.size() == traces.size()
                               ? "timeline.json"
                               : "timeline_device" + std::to_string(devices[0]) + ".json";
  const auto path = std::filesystem::path(c.run.out_dir) / name;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << parallel::chrome_trace_json(mine, devices) << "\n";
  if (c.distributed.is_main_process() || devices.size() != traces.size())
    std::printf("Timeline of the last step (Chrome trace, opens in Perfetto): %s\n",
                path.string().c_str());
}

// What every device of a run shares: the config, the model, the optimizer, the pipeline's
// traces.
class Run {
 public:
  Run(const config::TrainConfig& c, const mesh::Mesh& mesh, const Model& model,
      const TrainOptions& options)
      : c_(c),
        mesh_(mesh),
        model_(model),
        options_(options),
        steps_(model.total_steps > 0 ? model.total_steps : c.run.steps),
        optimizer_(make_adamw(c, steps_)),
        traces_(static_cast<std::size_t>(mesh.size())),
        stage_traces_(mesh.has_axis("pipe") ? static_cast<std::size_t>(mesh.axis_size("pipe"))
                                            : 0) {}

  // One device's run (ctx null: one device, no mesh).
  void device(spmd::DeviceContext* ctx) {
    const Key root = Key::from_seed(static_cast<std::uint64_t>(c_.run.seed));
    Composed composed(c_, ctx, model_.network);
    train::TrainState state =
        composed.create_state(optimizer_, root.fold_in(std::string_view("init")),
                              root.fold_in(std::string_view("dropout")));
    const DevicePlace place{.ctx = ctx,
                            .replica = composed.replica(),
                            .replicas = composed.data_parallel_size(),
                            .lead = ctx == nullptr || ctx->device() == 0};
    if (place.lead) {
      print_model_line(c_, model_, composed, state, steps_);
      if (options_.show_sharding && model_.network.init) {
        const tensor::TensorTree whole =
            model_.network.init(root.fold_in(std::string_view("init")), nullptr, nullptr, nullptr);
        std::printf(
            "%s", parallel::sharding_table(parallel::global_shapes(whole), composed.specs(), mesh_)
                      .c_str());
      }
    }
    const DeviceData data = model_.data(place);
    detail::Loop loop{.config = &c_,
                      .ctx = ctx,
                      .composed = &composed,
                      .optimizer = &optimizer_,
                      .state = &state,
                      .total_steps = steps_,
                      .log_every = c_.run.log_every,
                      .items_per_example = model_.items_per_example,
                      .items_name = model_.items_name,
                      .model_parameters = model_.num_parameters,
                      .batch = data.batch,
                      .loader = data.loader.get(),
                      .prefetch = c_.data.prefetch,
                      .eval_batches = data.eval,
                      .eval_every = model_.eval_every > 0 ? model_.eval_every : c_.run.eval_every,
                      .eval_at_start = c_.run.eval_at_start,
                      .stoppable = options_.stoppable,
                      .summary = model_.summary};
    parallel::Pipeline* pp = composed.pipeline();
    double bubble = 0.0;
    if (pp != nullptr)
      loop.after_training = [&]() -> std::map<std::string, double> {
        const bool threads = c_.distributed.comm_backend() == comm::Backend::Threads;
        bubble = parallel::pipeline_bubble(*ctx, pp->last_trace(), threads);
        std::lock_guard<std::mutex> lock(mu_);
        traces_[static_cast<std::size_t>(ctx->device())] = pp->last_trace();
        if (first_of_its_stage(*ctx))
          stage_traces_[static_cast<std::size_t>(pp->stage())] = pp->last_trace();
        return {{"pipeline_bubble", bubble}};
      };
    const RunResult r = detail::run_loop(loop);
    if (r.already_finished) trained_ = false;
    if (r.stopped) stopped_ = true;
    if (!place.lead) return;
    if (model_.report) std::printf("%s", model_.report(r, state, place).c_str());
    if (pp == nullptr) {
      std::printf(
          "Bytes held by device 0: parameters %s, optimizer state %s (replicated: %s and "
          "%s)\n",
          grouped(state.params.storage_bytes()).c_str(),
          grouped(state.opt_state.storage_bytes()).c_str(),
          grouped(4 * model_.num_parameters).c_str(), grouped(8 * model_.num_parameters).c_str());
    } else if (!r.already_finished) {
      const int stages = pp->num_stages(), v = static_cast<int>(c_.parallelism.virtual_stages);
      const int m = static_cast<int>(c_.parallelism.microbatches);
      const parallel::ScheduleKind kind = parallel::parse_schedule_kind(c_.parallelism.schedule);
      std::printf(
          "Measured pipeline bubble of the last step: %.1f%% (theory %.1f%%, unit-cost "
          "schedule %.1f%%)\n",
          100.0 * bubble, 100.0 * parallel::schedule_bubble_theory(kind, stages, m, v),
          100.0 * parallel::check_schedule(parallel::make_schedule(kind, stages, m, v))
                      .bubble_fraction);
    }
  }

  // After the devices: the pipeline's timeline files and, when asked, its measured timeline.
  /// Whether a device's run ended early by app::request_stop().
  bool stopped() const { return stopped_; }

  void finish(bool piped) const {
    if (!piped || !trained_) return;
    if (c_.run.timeline && !c_.run.out_dir.empty()) write_pipeline_timeline(c_, traces_);
    if (options_.show_schedule && c_.distributed.comm_backend() == comm::Backend::Threads &&
        c_.distributed.is_main_process())
      std::printf(
          "Measured timeline of the last step (the first device of each stage; on a "
          "machine with fewer cores than devices, waits for a core show as idle):\n%s",
          parallel::format_trace_timeline(stage_traces_).c_str());
  }

 private:
  // The first device of its stage: index 0 along every axis but "pipe".
  static bool first_of_its_stage(const spmd::DeviceContext& ctx) {
    for (const std::string& axis : ctx.mesh().axis_names())
      if (axis != "pipe" && ctx.axis_index(axis) != 0) return false;
    return true;
  }

  const config::TrainConfig& c_;
  const mesh::Mesh& mesh_;
  const Model& model_;
  const TrainOptions& options_;
  std::atomic<bool> stopped_{false};
  const std::int64_t steps_;
  const optim::AdamW optimizer_;
  std::mutex mu_;
  std::vector<parallel::PipelineTrace> traces_;
  std::vector<parallel::PipelineTrace> stage_traces_;
  std::atomic<bool> trained_{true};  // false: resumed at the last step, no schedule ran
};

}  // namespace

void register_model(ModelSpec spec) {
  DISTJAX_CHECK(!spec.name.empty() && spec.build, ConfigError,
                "[register_model] a model needs a name and a build function");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (const ModelSpec& m : r.models)
    DISTJAX_CHECK(m.name != spec.name, ConfigError, "[register_model] a model \"", spec.name,
                  "\" is registered already");
  r.models.push_back(std::move(spec));
}

std::vector<ModelSpec> models() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.models;
}

ModelSpec find_model(const std::string& name) {
  std::vector<std::string> names;
  for (ModelSpec& m : models()) {
    if (m.name == name) return std::move(m);
    names.push_back(m.name);
  }
  std::string msg = "[config] run.program = \"" + name + "\" is not a registered model";
  if (const std::string near = config::nearest_name(name, names); !near.empty())
    msg += "; did you mean \"" + near + "\"?";
  msg += " (models:";
  for (const std::string& n : names)
    msg += " " + n;
  throw ConfigError(msg + ")");
}

namespace {

// One process per device (MPI): the hosts the launcher placed the processes on, printed by
// the main process ("Processes: 8 on 2 hosts: node-a (ranks 0-3), node-b (ranks 4-7)"), so
// a run says where it runs as a cluster's launcher placed it.
void print_hosts(const spmd::DeviceContext& ctx) {
  if (ctx.device() != 0) return;
  std::printf("Processes: %s\n", comm::describe_hosts(comm::process_hosts()).c_str());
  std::fflush(stdout);
}

// Under MPI, each process's error also goes to <out_dir>/failures/process_<rank>.txt
// (comm::LaunchOptions::error_file): a launcher tearing a failed job down may drop the last
// lines its processes print (mpirun does), and the operator needs every process's account
// (which host it lost, where).
std::string failure_file(const config::TrainConfig& c) {
  return (std::filesystem::path(c.run.out_dir) / "failures" /
          ("process_" + std::to_string(c.distributed.rank) + ".txt"))
      .string();
}

}  // namespace

mesh::Mesh model_mesh(const config::TrainConfig& c, const ModelSpec& model) {
  return config::build_mesh(c.distributed, model.axes);
}

int train_prepared(const config::TrainConfig& c, const TrainOptions& options) {
  const ModelSpec spec = find_model(c.run.program);
  const mesh::Mesh mesh = model_mesh(c, spec);
  Model model = spec.build(c, mesh);
  if (model.description.empty()) model.description = spec.name;
  if (model.num_parameters == 0 && model.network.init)  // counted once on the host
    model.num_parameters =
        model.network.init(Key::from_seed(0), nullptr, nullptr, nullptr).num_elements();
  const bool piped = on_pipeline(c, mesh, model.network);
  if (c.distributed.is_main_process()) print_header(c, mesh, piped, model, options);
  Run run(c, mesh, model, options);
  if (!c.distributed.enabled) {
    // The one device: distributed.device (a GPU with "cuda"), or DISTJAX_DEVICE's default.
    const DeviceScope on(c.distributed.placement());
    run.device(nullptr);
  } else {
    const bool mpi = c.distributed.comm_backend() == comm::Backend::Mpi;
    auto device = [&](spmd::DeviceContext& ctx, const std::vector<tensor::Tensor>&) {
      if (mpi) print_hosts(ctx);
      run.device(&ctx);
      return std::vector<tensor::Tensor>{};
    };
    spmd::shard_map(mesh, device, {}, {},
                    {.backend = c.distributed.comm_backend(),
                     .device = c.distributed.placement(),
                     .timeout = c.distributed.timeout(),
                     .error_file = mpi ? failure_file(c) : std::string()})(
        std::vector<tensor::Tensor>{});
  }
  run.finish(piped);
  return run.stopped() ? kStoppedStatus : 0;
}


int train(config::TrainConfig c, const std::string& source, const TrainOptions& options) {
  return train_prepared(prepare_program(std::move(c), source), options);
}

}  // namespace distjax::app
