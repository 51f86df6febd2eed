// Pipeline parallelism on real data: the PPClassifier (an input Dense, residual MLP
// blocks cut into stages, LayerNorm + Dense head) on Fashion-MNIST over a ("data"=2,
// "pipe"=4) mesh of simulated devices, micro-batches run by a checked schedule (1F1B by
// default; GPipe, interleaved 1F1B, ZB-H1). Prints "[PP] Step i: Loss = ..." lines and the
// test accuracy; with --show-schedule also the schedule's timeline and, for the last
// step, the measured per-stage timeline and bubble against the theory.
//
//   ./build/pipeline_parallelism [--data 2 --pipe 4 --schedule 1f1b --microbatches 8]
//   ./build/pipeline_parallelism --schedule zbh1 --show-schedule
//   mpirun -np 8 ./build/pipeline_parallelism --backend mpi       (one process per device)
#include <cstdio>
#include <mutex>
#include <string>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/pp_classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"
#include "example_common.hpp"

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

int run(int argc, char** argv) {
  examples::Args args("pipeline_parallelism",
                      "the pipeline-parallel MLP classifier on Fashion-MNIST");
  long long& data_size = args.flag("data", 2LL, "devices along \"data\" (data parallel)");
  long long& pipe = args.flag("pipe", 4LL, "devices along \"pipe\" (pipeline stages)");
  std::string& schedule_name =
      args.flag("schedule", std::string("1f1b"), "gpipe, 1f1b, interleaved or zbh1");
  long long& microbatches = args.flag("microbatches", 8LL, "micro-batches per step (m)");
  long long& virtual_stages = args.flag("virtual-stages", 2LL, "chunks per stage (interleaved)");
  long long& layers = args.flag("layers", 8LL, "residual MLP blocks, cut over the stages");
  long long& hidden = args.flag("hidden", 256LL, "width of the blocks");
  long long& steps = args.flag("steps", 200LL, "optimizer steps");
  long long& batch_size = args.flag("batch-size", 128LL, "global batch (split over \"data\")");
  long long& log_every = args.flag("log-every", 20LL, "steps between progress lines");
  long long& show = args.flag("show-schedule", 0LL,
                              "1: print the schedule and the measured bubble of the last step");
  std::string& out = args.flag("out", std::string("runs/pipeline_parallelism"), "output directory");
  std::string& data_dir = args.flag("data-dir", std::string(data::kFashionMnistDir),
                                    "directory of the Fashion-MNIST IDX files");
  std::string& backend_name =
      args.flag("backend", examples::default_backend(),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  comm::Backend backend;
  if (!examples::parse_backend("pipeline_parallelism", backend_name, &backend)) return 2;
  const parallel::ScheduleKind kind = parallel::parse_schedule_kind(schedule_name);
  const int v = kind == parallel::ScheduleKind::Interleaved1F1B ? static_cast<int>(virtual_stages) : 1;
  const long long devices = data_size * pipe;
  if (backend == comm::Backend::Mpi && examples::mpi_world_size() > 0 &&
      examples::mpi_world_size() != devices) {
    std::fprintf(stderr, "pipeline_parallelism: %lld MPI ranks for a %lld x %lld mesh\n",
                 examples::mpi_world_size(), data_size, pipe);
    return 2;
  }
  if (batch_size % (data_size * microbatches) != 0) {
    std::fprintf(stderr,
                 "pipeline_parallelism: --batch-size %lld must be divisible by --data %lld x "
                 "--microbatches %lld\n",
                 batch_size, data_size, microbatches);
    return 2;
  }
  const mesh::Mesh mesh({static_cast<int>(data_size), static_cast<int>(pipe)}, {"data", "pipe"});
  // The schedule is data: built and checked here, before any device runs.
  const parallel::PipelineSchedule schedule = parallel::make_schedule(
      kind, static_cast<int>(pipe), static_cast<int>(microbatches), v);
  const parallel::ScheduleReport report = parallel::check_schedule(schedule);
  if (examples::main_process()) {
    std::printf("Mesh (%s backend):\n%s\n", backend_name.c_str(), mesh.to_string().c_str());
    std::printf("[PP] %s: %lld stages x %d chunks, %lld micro-batches of %lld, peak in flight "
                "on stage 0: %d\n",
                schedule_name.c_str(), pipe, v, microbatches,
                batch_size / data_size / microbatches, report.peak_in_flight[0]);
    if (show) std::printf("%s", parallel::format_timeline(schedule, report).c_str());
  }

  const data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  const data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  const models::PPClassifier model({.in_features = 784,
                                    .hidden = hidden,
                                    .num_layers = layers,
                                    .mlp_expansion = 2,
                                    .num_classes = 10});
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(
                        0.0, 1e-3, std::min<long long>(20, steps - 1), steps, 1e-5),
                    .decay_mask = optim::default_decay_mask()});
  const Key root = Key::from_seed(42);
  std::mutex mu;
  std::vector<parallel::PipelineTrace> traces(static_cast<std::size_t>(pipe));

  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const int replica = ctx.axis_index("data");
    const bool lead = ctx.device() == 0;
    nn::ParamSpecs specs;
    parallel::DataParallel dp(ctx, "data", &specs);
    parallel::Pipeline pp(ctx, model,
                          {.schedule = kind,
                           .microbatches = static_cast<int>(microbatches),
                           .virtual_stages = v},
                          &dp);
    // Each device creates only its stage's parameters.
    TensorTree params = model.init(root, pp.chunks(), pp.num_chunks(), &specs, &ctx);
    train::TrainState state = train::TrainState::create(params, opt, root.fold_in(1), pp);
    data::DataLoader loader(train_set, {.batch_size = batch_size,
                                        .seed = 42,
                                        .num_shards = static_cast<int>(data_size),
                                        .shard_index = replica});
    train::Trainer trainer({.out_dir = lead ? out : std::string(),
                            .total_steps = steps,
                            .log_every = 1 << 30,  // this example prints its own lines
                            .mesh = "data=" + std::to_string(data_size) +
                                    ",pipe=" + std::to_string(pipe),
                            .backend = backend_name,
                            .print = false},
                           opt, nullptr, {.max_grad_norm = 1.0, .strategy = &pp});
    for (long long s = 1; s <= steps; ++s) {
      const train::Batch batch = loader.next();
      if (s == steps) ctx.comm("pipe").barrier();  // align the measured step's start
      const train::Metrics m = trainer.step(state, batch);
      if (lead && (s % log_every == 0 || s == 1 || s == steps))
        std::printf("[PP] Step %lld: Loss = %.4f, Accuracy = %.4f\n", s, m.mean("loss"),
                    m.mean("accuracy"));
    }
    const double bubble =
        parallel::pipeline_bubble(ctx, pp.last_trace(), backend == comm::Backend::Threads);
    if (replica == 0 && backend == comm::Backend::Threads) {
      std::lock_guard<std::mutex> lock(mu);
      traces[static_cast<std::size_t>(pp.stage())] = pp.last_trace();
    }
    // Test accuracy: the pipeline's forward over this replica's share of the test set.
    const std::int64_t chunk = batch_size / data_size;
    const std::int64_t share = test_set.size() / data_size / chunk * chunk;
    train::Metrics eval;
    for (std::int64_t i = 0; i < share; i += chunk) {
      const std::int64_t at = replica * share + i;
      eval.merge(pp.evaluate(state.params, test_set.slice(at, at + chunk)));
    }
    trainer.finish(state, {{"devices", double(devices)},
                           {"bubble", bubble},
                           {"test_accuracy", eval.mean("accuracy")}});
    if (lead) {
      std::printf("[PP] Test accuracy: %.2f%% (%lld images) after %lld steps\n",
                  100.0 * eval.mean("accuracy"), static_cast<long long>(eval.at("accuracy").count),
                  steps);
      std::printf("[PP] Measured bubble of the last step: %.1f%% (theory %.1f%%, unit-cost "
                  "schedule %.1f%%)\n",
                  100.0 * bubble,
                  100.0 * parallel::schedule_bubble_theory(kind, static_cast<int>(pipe),
                                                           static_cast<int>(microbatches), v),
                  100.0 * report.bubble_fraction);
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  if (show && backend == comm::Backend::Threads && examples::main_process())
    std::printf("Measured timeline of the last step (data replica 0):\n%s",
                parallel::format_trace_timeline(traces).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::examples::run_main("pipeline_parallelism", [&] { return run(argc, argv); });
}
