// Program pipeline_parallelism: the PPClassifier (an input Dense, residual MLP blocks cut
// into stages, LayerNorm + Dense head) on Fashion-MNIST over a ("data", "pipe") mesh,
// micro-batches run by a checked schedule (parallelism.schedule: 1f1b, gpipe,
// interleaved, zbh1, interleaved_zb). Prints "[PP] Step i: Loss = ..." lines, the test accuracy and the
// measured bubble of the last step against the theory; the example binary's
// --show-schedule also prints the schedule and the measured per-stage timeline.
#include <algorithm>
#include <cstdio>
#include <mutex>

#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/app/model_specs.hpp"
#include "distjax/models/pp_classifier.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

using tensor::Tensor;

int run_pipeline_parallelism(const config::TrainConfig& c) {
  return run_pipeline_parallelism(c, /*show_schedule=*/false);
}

void check_pipeline_parallelism(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "pipe"});
  DISTJAX_CHECK(mesh.ndim() == 2 && mesh.has_axis("data") && mesh.has_axis("pipe"), ConfigError,
                "[pipeline_parallelism] runs on a (\"data\", \"pipe\") mesh, got ", mesh.describe());
  parallel::make_schedule(parallel::parse_schedule_kind(c.parallelism.schedule),
                          mesh.axis_size("pipe"), static_cast<int>(c.parallelism.microbatches),
                          static_cast<int>(c.parallelism.virtual_stages));
}

int run_pipeline_parallelism(const config::TrainConfig& c, bool show_schedule) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "pipe"});
  const bool threads = c.distributed.comm_backend() == comm::Backend::Threads;
  const int n_data = mesh.axis_size("data"), pipe = mesh.axis_size("pipe");
  const int m = static_cast<int>(c.parallelism.microbatches);
  const parallel::ScheduleKind kind = parallel::parse_schedule_kind(c.parallelism.schedule);
  const int v = static_cast<int>(c.parallelism.virtual_stages);
  // The schedule is data: built and checked here, before any device runs.
  const parallel::PipelineSchedule schedule = parallel::make_schedule(kind, pipe, m, v);
  const parallel::ScheduleReport report = parallel::check_schedule(schedule);
  if (c.distributed.is_main_process()) {
    std::printf("Mesh (%s backend):\n%s\n", backend_label(c).c_str(), mesh.to_string().c_str());
    std::printf("[PP] %s: %d stages x %d chunks, %d micro-batches of %lld, peak in flight on "
                "stage 0: %d\n",
                c.parallelism.schedule.c_str(), pipe, v, m,
                static_cast<long long>(c.run.batch_size / n_data / m), report.peak_in_flight[0]);
    if (show_schedule) std::printf("%s", parallel::format_timeline(schedule, report).c_str());
  }

  const FashionMnist mnist = load_fashion_mnist(c);
  const data::ArrayDataset& train_set = mnist.train;
  const data::ArrayDataset& test_set = mnist.test;
  const models::PPClassifier model({.in_features = 784,
                                    .hidden = c.model.hidden,
                                    .num_layers = c.model.layers,
                                    .mlp_expansion = 2,
                                    .num_classes = 10,
                                    .dropout = static_cast<float>(c.model.dropout)});
  const std::int64_t steps = c.run.steps;
  const optim::AdamW opt = make_adamw(c, steps);
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const Key root = Key::from_seed(seed);
  std::mutex mu;
  std::vector<parallel::PipelineTrace> traces(static_cast<std::size_t>(pipe));
  bool trained = true;  // false: resumed at the last step, no schedule ran (set by device 0)
  // The whole model's parameters, for summary.json: counted once, from the one-device init.
  const std::int64_t model_parameters = model.init(Key::from_seed(0)).num_elements();
  // The whole model is only ever run cut into stages (init and loss come from the module).
  const ModelSpec spec{.pipeline = &model};

  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    Composed composed(c, &ctx, spec);
    parallel::Pipeline& pp = *composed.pipeline();
    // Each device creates only its stage's parameters.
    train::TrainState state = composed.create_state(opt, root, root.fold_in(1));
    data::DataLoader loader(train_set, {.batch_size = c.run.batch_size,
                                        .seed = seed,
                                        .num_shards = n_data,
                                        .shard_index = replica});
    // Test accuracy: the pipeline's forward over this replica's share of the test set.
    const std::int64_t chunk = c.run.batch_size / n_data;
    const std::int64_t share = test_set.size() / n_data / chunk * chunk;
    std::vector<train::Batch> test_batches;
    for (std::int64_t at = replica * share; at < (replica + 1) * share; at += chunk)
      test_batches.push_back(test_set.slice(at, at + chunk));
    double bubble = 0.0;
    const LoopResult r = run_loop(
        {.config = &c,
         .ctx = &ctx,
         .composed = &composed,
         .optimizer = &opt,
         .state = &state,
         .total_steps = steps,
         .log_every = 1 << 30,  // this program prints its own lines
         .model_parameters = model_parameters,
         .print = false,
         .batch = [&](std::int64_t) { return loader.next(); },
         .loader = &loader,
         .eval_batches = std::move(test_batches),
         .on_step = step_lines("PP", c, lead),
         .after_training = [&]() -> std::map<std::string, double> {
           bubble = parallel::pipeline_bubble(ctx, pp.last_trace(), threads);
           if (replica == 0 && threads) {
             std::lock_guard<std::mutex> lock(mu);
             traces[static_cast<std::size_t>(pp.stage())] = pp.last_trace();
           }
           return {{"devices", double(mesh.size())}, {"bubble", bubble}};
         },
         .summary = [&](const LoopResult& r) -> std::map<std::string, double> {
           return {{"test_accuracy", r.eval.mean("accuracy")}};
         }});
    if (lead) {
      std::printf("[PP] Test accuracy: %.2f%% (%lld images) after %lld steps\n",
                  100.0 * r.eval.mean("accuracy"), static_cast<long long>(r.eval.at("accuracy").count),
                  static_cast<long long>(steps));
      trained = !r.already_finished;
    }
    if (lead && trained) {
      std::printf("[PP] Measured bubble of the last step: %.1f%% (theory %.1f%%, unit-cost "
                  "schedule %.1f%%)\n",
                  100.0 * bubble, 100.0 * parallel::schedule_bubble_theory(kind, pipe, m, v),
                  100.0 * report.bubble_fraction);
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {},
                  {.backend = c.distributed.comm_backend(), .device = c.distributed.placement()})(std::vector<Tensor>{});
  if (show_schedule && threads && trained && c.distributed.is_main_process())
    std::printf("Measured timeline of the last step (data replica 0; on a machine with fewer "
                "cores than devices, waits for a core show as idle):\n%s",
                parallel::format_trace_timeline(traces).c_str());
  return 0;
}

}  // namespace distjax::app
