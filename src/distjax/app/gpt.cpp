// Program gpt (the fsdp and tensor_parallel_gpt examples, and the main job): the GPT on
// the fortunes corpus over a ("data", "model"[, "pipe"]) mesh, data parallel over "data"
// (optionally with fully sharded parameters, parallelism.shard = "parameters", and remat
// of its blocks), tensor parallel over "model" in any layout (Megatron, sequence and
// vocabulary parallel, gather, async rings), and with distributed.pipeline_parallel_size
// > 1 pipelined over "pipe" (models::TransformerPipeline under parallelism.schedule; with
// model.tie_embeddings = false, as a pipeline cannot tie). Prints the mesh, per-step loss (a
// progress bar on a terminal), validation bits per byte, the bytes each device holds, and where the
// files are.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "distjax/app/model_specs.hpp"
#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/config/distributed_config.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::app {

using tensor::Tensor;

void check_gpt(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  const int n_model = mesh.axis_size("model");
  const int n_pipe = mesh.has_axis("pipe") ? mesh.axis_size("pipe") : 1;
  DISTJAX_CHECK(c.model.heads % n_model == 0, ConfigError, "[gpt] model.heads = ", c.model.heads,
                " must be divisible by the \"model\" axis size ", n_model);
  const parallel::TPLayout layout = n_model > 1
                                        ? parallel::tp_layout_from_name(c.parallelism.tp_layout)
                                        : parallel::TPLayout::None;
  DISTJAX_CHECK(c.distributed.mixed_precision == config::MixedPrecision::No ||
                    layout != parallel::TPLayout::Async,
                NotImplemented, "[gpt] distributed.mixed_precision = \"",
                config::mixed_precision_name(c.distributed.mixed_precision),
                "\" with parallelism.tp_layout = \"async\": the collective matmuls run in f32 "
                "only; use another layout or mixed_precision = \"no\"");
  DISTJAX_CHECK(!c.parallelism.sequence_parallel || layout != parallel::TPLayout::Megatron ||
                    c.data.seq_len % n_model == 0,
                ConfigError, "[gpt] parallelism.sequence_parallel: data.seq_len = ", c.data.seq_len,
                " must be divisible by the \"model\" axis size ", n_model);
  if (n_pipe > 1) {
    // The schedule and the split of the layers into chunks, as the pipeline builds them.
    const int v = static_cast<int>(c.parallelism.virtual_stages);
    parallel::make_schedule(parallel::parse_schedule_kind(c.parallelism.schedule), n_pipe,
                            static_cast<int>(c.parallelism.microbatches), v);
    parallel::partition_layers(static_cast<int>(c.model.layers), n_pipe * v);
  }
}

namespace {

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

void print_header(const config::TrainConfig& c, const mesh::Mesh& mesh,
                  const models::TransformerConfig& m, const nn::Precision& precision) {
  const bool piped = mesh.has_axis("pipe") && mesh.axis_size("pipe") > 1;
  std::printf("Mesh (%s backend, tensor parallel layout %s%s%s%s, precision %s):\n%s\n",
              backend_label(c).c_str(), parallel::tp_layout_name(m.tp.layout),
              m.tp.sequence_parallel ? " + sequence parallel" : "",
              m.tp.vocab_parallel ? " + vocabulary parallel" : "",
              c.parallelism.shard == config::Shard::Parameters
                  ? ", parameters fully sharded over \"data\""
                  : "",
              precision.str().c_str(), mesh.to_string().c_str());
  if (!piped) return;
  const int n_pipe = mesh.axis_size("pipe"), v = static_cast<int>(c.parallelism.virtual_stages);
  const int mb = static_cast<int>(c.parallelism.microbatches);
  const parallel::ScheduleReport report = parallel::check_schedule(parallel::make_schedule(
      parallel::parse_schedule_kind(c.parallelism.schedule), n_pipe, mb, v));
  std::printf("Pipeline: %s over %d stages x %d chunks, %d micro-batches per step; bubble "
              "%.1f%% in theory\n",
              c.parallelism.schedule.c_str(), n_pipe, v, mb, 100.0 * report.bubble_fraction);
}

}  // namespace

int run_gpt(const config::TrainConfig& c) {
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  const int n_data = mesh.axis_size("data");
  const std::int64_t batch_size = c.run.batch_size, seq_len = c.data.seq_len, steps = c.run.steps;
  const TextData text = load_text(c);
  const std::vector<train::Batch>& val = text.validation();
  const std::string bits = "bits_per_" + text.unit();
  const models::Transformer model(transformer_config(c, transformer_tp(c, mesh)));
  const models::TransformerPipeline pipelined(model.config());
  if (c.distributed.is_main_process()) {
    print_header(c, mesh, model.config(), precision_of(c));
    std::printf("Validation: %s\n", text.validation_note().c_str());
  }
  const optim::AdamW opt = make_adamw(c, steps);
  const Key root = Key::from_seed(static_cast<std::uint64_t>(c.run.seed));
  std::mutex trace_mu;
  std::vector<parallel::PipelineTrace> traces(static_cast<std::size_t>(mesh.size()));
  std::atomic<bool> trained{true};  // false: resumed at the last step, no schedule ran

  // Data x tensor [x pipe]: each device holds its shards (of its stage's chunks) only.
  auto device_program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const bool lead = ctx.device() == 0;
    Composed composed(c, &ctx, transformer_spec(model, &pipelined));
    parallel::Pipeline* pp = composed.pipeline();
    train::TrainState state = composed.create_state(opt, root.fold_in(std::string_view("init")),
                                                    root.fold_in(std::string_view("dropout")));
    if (lead) {
      std::int64_t sharded = 0;
      for (const auto& [path, spec] : composed.specs())
        if (spec.size() > 0) ++sharded;
      std::printf("GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %lld on device 0",
                  static_cast<long long>(c.model.layers), static_cast<long long>(c.model.d_model),
                  static_cast<long long>(c.model.heads), static_cast<long long>(seq_len),
                  static_cast<long long>(model.num_params()),
                  static_cast<long long>(state.params.num_elements()));
      if (pp != nullptr)
        std::printf(" (stage 0 of %d)\n", pp->num_stages());
      else
        std::printf("; %lld of %zu tensors split over the mesh\n", static_cast<long long>(sharded),
                    state.params.size());
    }
    const int replica = composed.replica();
    const Key data_key = root.fold_in(std::string_view("data"));
    Loop loop{.config = &c,
              .ctx = &ctx,
              .composed = &composed,
              .optimizer = &opt,
              .state = &state,
              .total_steps = steps,
              .log_every = c.run.log_every,
              .items_per_example = static_cast<double>(seq_len),
              .items_name = "tokens",
              .model_parameters = model.num_params(),
              // The data of step s is drawn from the step alone.
              .batch = [&](std::int64_t step) {
                const Key key = data_key.fold_in(static_cast<std::uint64_t>(step));
                return replica_slice(text.sample(batch_size, seq_len, key), replica, n_data);
              },
              .eval_every = c.run.eval_every};
    for (const train::Batch& b : val)
      loop.eval_batches.push_back(replica_slice(b, replica, n_data));
    double bubble = 0.0;
    if (pp != nullptr)
      loop.after_training = [&]() -> std::map<std::string, double> {
        bubble = parallel::pipeline_bubble(ctx, pp->last_trace(),
                                           c.distributed.comm_backend() == comm::Backend::Threads);
        std::lock_guard<std::mutex> lock(trace_mu);
        traces[static_cast<std::size_t>(ctx.device())] = pp->last_trace();
        return {{"pipeline_bubble", bubble}};
      };
    loop.summary = [&](const LoopResult& r) -> std::map<std::string, double> {
      return {{"val_" + bits, r.eval.mean(bits)}};
    };
    const LoopResult r = run_loop(loop);
    if (r.already_finished) trained = false;
    if (!lead) return std::vector<Tensor>{};
    std::printf("Validation: %.3f bits per %s (uniform guessing: %.1f)", r.eval.mean(bits),
                text.unit().c_str(), std::log2(static_cast<double>(model.config().vocab)));
    if (pp != nullptr && r.already_finished)
      std::printf("\n");
    else if (pp != nullptr)
      std::printf("; measured pipeline bubble of the last step %.1f%%\n", 100.0 * bubble);
    else
      std::printf("\nBytes held by device 0: parameters %lld, optimizer state %lld (replicated: "
                  "%lld and %lld)\n",
                  static_cast<long long>(state.params.storage_bytes()),
                  static_cast<long long>(state.opt_state.storage_bytes()),
                  static_cast<long long>(4 * model.num_params()),
                  static_cast<long long>(8 * model.num_params()));
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, device_program, {}, {},
                  {.backend = c.distributed.comm_backend(), .device = c.distributed.placement()})(std::vector<Tensor>{});
  const bool piped = mesh.has_axis("pipe") && mesh.axis_size("pipe") > 1;
  if (piped && trained && c.run.timeline && !c.run.out_dir.empty())
    write_pipeline_timeline(c, traces);
  return 0;
}

}  // namespace distjax::app
