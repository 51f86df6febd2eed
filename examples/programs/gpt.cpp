// Program gpt (the fsdp and tensor_parallel_gpt examples, and the main job): the GPT on
// the fortunes corpus over a ("data", "model"[, "pipe"]) mesh, data parallel over "data"
// (optionally with fully sharded parameters, parallelism.fsdp.modules = ["*"], and remat
// of its blocks), tensor parallel over "model" in any layout (Megatron, sequence and
// vocabulary parallel, gather, async rings), and with distributed.pipeline_parallel_size
// > 1 pipelined over "pipe" (models::TransformerPipeline under parallelism.schedule; with
// model.tie_embeddings = false, as a pipeline cannot tie). Prints the mesh, per-step loss (a
// progress bar on a terminal), validation bits per byte, the bytes each device holds, and where the
// files are.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numbers>

#include "distjax/config/distributed_config.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/parallel/tp_transformer_block.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/trainer.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

namespace distjax::examples {

using tensor::Tensor;
using tensor::TensorTree;

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

int run_gpt(const config::TrainConfig& c) {
  const bool fsdp_on = !c.parallelism.fsdp.modules.empty();
  auto remat_of = [&](const char* module) {
    return std::find(c.parallelism.remat.begin(), c.parallelism.remat.end(), module) !=
           c.parallelism.remat.end();
  };
  const bool remat = remat_of("Block");
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  const int n_data = mesh.axis_size("data"), n_model = mesh.axis_size("model");
  const int n_pipe = mesh.has_axis("pipe") ? mesh.axis_size("pipe") : 1;
  const bool piped = n_pipe > 1;
  const parallel::TPLayout layout = n_model > 1
                                        ? parallel::tp_layout_from_name(c.parallelism.tp_layout)
                                        : parallel::TPLayout::None;
  const nn::Precision precision = precision_of(c);
  const bool sequence_parallel = c.parallelism.sequence_parallel;
  const bool vocab_parallel = c.parallelism.vocab_parallel;
  const std::string backend_name = backend_label(c);
  if (c.distributed.is_main_process())
    std::printf("Mesh (%s backend, tensor parallel layout %s%s%s%s, precision %s):\n%s\n",
                backend_name.c_str(), parallel::tp_layout_name(layout),
                sequence_parallel ? " + sequence parallel" : "",
                vocab_parallel ? " + vocabulary parallel" : "",
                fsdp_on ? ", parameters fully sharded over \"data\"" : "", precision.str().c_str(),
                mesh.to_string().c_str());

  const std::int64_t batch_size = c.run.batch_size, seq_len = c.data.seq_len;
  const std::int64_t steps = c.run.steps;
  const std::string data_dir = c.data.dir.empty() ? data::kFortunesDir : c.data.dir;
  const data::ByteCorpus corpus = data::load_fortunes(data_dir, c.data.validation_fraction);
  const std::vector<train::Batch> val =
      data::sequential_windows(corpus.validation, batch_size, seq_len, c.run.eval_batches);
  const models::Transformer model(
      {.vocab = 256,
       .d_model = c.model.d_model,
       .num_layers = c.model.layers,
       .num_heads = c.model.heads,
       .max_len = seq_len,
       .tied_embeddings = c.model.tie_embeddings,
       .dropout = static_cast<float>(c.model.dropout),
       .remat = remat,  // with FSDP: a block's gathered weights live only while it runs
       .remat_attn = remat_of("Attn"),
       .remat_mlp = remat_of("MLP"),
       .tp = {.layout = layout,
              .sequence_parallel = sequence_parallel,
              .vocab_parallel = vocab_parallel,
              .bidirectional = c.parallelism.bidirectional}});
  const optim::AdamW opt = make_adamw(c, steps);
  // ["*"]: every parameter; otherwise only those of the listed module kinds.
  const nn::FullySharded fsdp{.axis = "data",
                              .min_weight_size = c.parallelism.fsdp.min_weight_size,
                              .modules = c.parallelism.fsdp.modules};
  const Key root = Key::from_seed(static_cast<std::uint64_t>(c.run.seed));

  const models::TransformerPipeline pipelined(model.config());
  const parallel::PipelineOptions pipe_options{
      .schedule = parallel::parse_schedule_kind(c.parallelism.schedule),
      .microbatches = static_cast<int>(c.parallelism.microbatches),
      .virtual_stages = static_cast<int>(c.parallelism.virtual_stages),
      .fsdp = fsdp_on ? &fsdp : nullptr,
      .precision = precision};
  if (piped && c.distributed.is_main_process()) {
    const parallel::PipelineSchedule sched = parallel::make_schedule(
        pipe_options.schedule, n_pipe, pipe_options.microbatches, pipe_options.virtual_stages);
    const parallel::ScheduleReport report = parallel::check_schedule(sched);
    std::printf("Pipeline: %s over %d stages x %d chunks, %d micro-batches per step; bubble "
                "%.1f%% in theory\n",
                c.parallelism.schedule.c_str(), n_pipe, pipe_options.virtual_stages,
                pipe_options.microbatches, 100.0 * report.bubble_fraction);
  }
  // The guide's pitfalls (a weight split over "data" without FSDP, an axis no strategy
  // splits work over, a spec naming an axis the mesh lacks) refused before the first step.
  const parallel::ShardingPlan sharding_plan{
      .data_axes = "data",
      .fully_sharded_axes = fsdp_on ? mesh::Axes("data") : mesh::Axes(),
      .pipeline_axes = piped ? mesh::Axes("pipe") : mesh::Axes()};
  std::mutex trace_mu;
  std::vector<parallel::PipelineTrace> traces(static_cast<std::size_t>(mesh.size()));
  std::vector<int> traced;

  // The Trainer of every device (files and lines from the main one) and the step options.
  // run.timeline: a pipelined run writes the spans of every action (timeline.json, below),
  // the others each device's step phases (timeline_device<d>.json).
  auto trainer_config = [&](int device, bool resumed) -> train::TrainerConfig {
    const bool lead = device == 0;
    return {.out_dir = lead ? c.run.out_dir : std::string(),
            .total_steps = steps,
            .log_every = c.run.log_every,
            .items_per_example = static_cast<double>(seq_len),
            .items_name = "tokens",
            .mesh = mesh.describe(),
            .backend = backend_name,
            .print = lead,
            .append = resumed,
            .timeline_file = piped ? std::string() : timeline_file(c, device),
            .device = device};
  };
  auto step_options = [&](train::Strategy* strategy) -> train::TrainStepOptions {
    return {.num_minibatches = static_cast<int>(c.run.grad_accum_steps),
            .max_grad_norm = c.optimizer.max_grad_norm,
            .strategy = strategy};
  };

  auto device_program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    if (piped) {
      // Data x tensor x pipe: each device holds its stage's shards only.
      const bool lead = ctx.device() == 0;
      const int replica = ctx.axis_index("data");
      nn::ParamSpecs specs;
      parallel::DataParallel dp(ctx, "data", &specs);
      parallel::Pipeline pp(ctx, pipelined, pipe_options, &dp);
      train::TrainState state = train::TrainState::create(
          pipelined.init(root.fold_in(std::string_view("init")), pp.chunks(), pp.num_chunks(),
                         &specs, &ctx, fsdp_on ? &fsdp : nullptr),
          opt, root.fold_in(std::string_view("dropout")), pp);
      parallel::check_sharding(specs, mesh, sharding_plan);
      enable_loss_scale(c, state);  // f16: scales pp.module_loss(), the step's loss function
      if (lead)
        std::printf("GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %lld on device 0 "
                    "(stage 0 of %d)\n",
                    static_cast<long long>(c.model.layers), static_cast<long long>(c.model.d_model),
                    static_cast<long long>(c.model.heads), static_cast<long long>(seq_len),
                    static_cast<long long>(model.num_params()),
                    static_cast<long long>(state.params.num_elements()), n_pipe);
      // The data of step s is drawn from the step alone: the position to save is the step.
      train::Checkpointer ckpt(checkpoint_config(c), {&ctx, &specs, &pp});
      const bool resumed = ckpt.restore(state).has_value();
      if (resumed && lead)
        std::printf("Resumed from %s at step %lld\n", ckpt.config().dir.c_str(),
                    static_cast<long long>(state.step));
      train::Trainer trainer(trainer_config(ctx.device(), resumed), opt, pp.module_loss(),
                             step_options(&pp));
      const std::int64_t per = batch_size / n_data;
      const Key data_key = root.fold_in(std::string_view("data"));
      auto evaluate = [&] {
        train::Metrics eval;
        for (const train::Batch& b : val)
          eval.merge(pp.evaluate(state.params, b.slice(replica * per, (replica + 1) * per)));
        eval.add("bits_per_byte", eval.at("loss").sum / std::numbers::ln2, eval.at("loss").count);
        trainer.log_eval(state.step, eval);
        return eval;
      };
      while (state.step < steps) {
        const train::Batch global =
            data::sample_windows(corpus.train, batch_size, seq_len,
                                 data_key.fold_in(static_cast<std::uint64_t>(state.step)));
        if (state.step + 1 == steps) ctx.comm(mesh::Axes("pipe")).barrier();  // the traced step
        trainer.step(state, global.slice(replica * per, (replica + 1) * per));
        ckpt.maybe_save(state, {0, state.step});
        if (c.run.eval_every > 0 && state.step % c.run.eval_every == 0 && state.step < steps)
          evaluate();
      }
      const std::string saved = ckpt.save(state, {0, state.step});
      const double bubble = parallel::pipeline_bubble(
          ctx, pp.last_trace(), c.distributed.comm_backend() == comm::Backend::Threads);
      {
        std::lock_guard<std::mutex> lock(trace_mu);
        traces[static_cast<std::size_t>(ctx.device())] = pp.last_trace();
      }
      const train::Metrics eval = evaluate();
      trainer.finish(state, {{"val_bits_per_byte", eval.mean("bits_per_byte")},
                             {"pipeline_bubble", bubble}});
      if (lead) {
        std::printf("Validation: %.3f bits per byte (uniform guessing: 8); measured pipeline "
                    "bubble of the last step %.1f%%\n",
                    eval.mean("bits_per_byte"), 100.0 * bubble);
        if (ckpt.config().saves)
          std::printf("Checkpoint: %s (continue with --resume; list with distjax ckpt inspect)\n",
                      train::find_checkpoint(ckpt.config().dir).value_or(saved).c_str());
      }
      return std::vector<Tensor>{};
    }
    const bool lead = ctx.device() == 0;
    const int replica = ctx.axis_index("data");
    nn::ParamSpecs specs;
    parallel::DataParallel dp(ctx, "data", &specs);
    train::TrainState state = train::TrainState::create(
        model.init(root.fold_in(std::string_view("init")), &specs, &ctx, fsdp_on ? &fsdp : nullptr),
        opt, root.fold_in(std::string_view("dropout")), dp);
    parallel::check_sharding(specs, mesh, sharding_plan);
    enable_loss_scale(c, state);
    auto loss_fn = [&](bool train) -> train::LossFn {
      return [&, train](const TensorTree& p, const train::Batch& b, Key k) {
        nn::Scope s = nn::Scope::apply(&p, train, k).on(ctx).with_precision(precision);
        if (fsdp_on) s = s.fully_sharded(fsdp);
        Tensor loss = model.loss(s, b.inputs, b.labels);
        const double bytes = static_cast<double>(b.labels.numel()), nats = loss.item<double>();
        train::Metrics m;
        m.add("loss", nats * bytes, bytes);
        m.add("bits_per_byte", nats / std::numbers::ln2 * bytes, bytes);
        return std::make_pair(loss, m);
      };
    };
    if (lead) {
      std::int64_t sharded = 0;
      for (const auto& [path, spec] : specs)
        if (spec.size() > 0) ++sharded;
      std::printf(
          "GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %lld on device 0; %lld of "
          "%zu tensors split over the mesh\n",
          static_cast<long long>(c.model.layers), static_cast<long long>(c.model.d_model),
          static_cast<long long>(c.model.heads), static_cast<long long>(seq_len),
          static_cast<long long>(model.num_params()),
          static_cast<long long>(state.params.num_elements()), static_cast<long long>(sharded),
          state.params.size());
    }
    train::Checkpointer ckpt(checkpoint_config(c), {&ctx, &specs, &dp});
    const bool resumed = ckpt.restore(state).has_value();
    if (resumed && lead)
      std::printf("Resumed from %s at step %lld\n", ckpt.config().dir.c_str(),
                  static_cast<long long>(state.step));
    train::Trainer trainer(trainer_config(ctx.device(), resumed), opt, loss_fn(true),
                           step_options(&dp));
    const std::int64_t per = batch_size / n_data;
    const Key data_key = root.fold_in(std::string_view("data"));
    while (state.step < steps) {
      const train::Batch global =
          data::sample_windows(corpus.train, batch_size, seq_len,
                               data_key.fold_in(static_cast<std::uint64_t>(state.step)));
      trainer.step(state, global.slice(replica * per, (replica + 1) * per));
      ckpt.maybe_save(state, {0, state.step});
    }
    const std::string saved = ckpt.save(state, {0, state.step});
    if (lead && !saved.empty()) std::printf("Checkpoint: %s\n", saved.c_str());
    // Every device evaluates every validation batch (the same gathers everywhere).
    const train::Metrics eval = train::evaluate(state.params, val, loss_fn(false), Key{});
    trainer.finish(state, {{"val_bits_per_byte", eval.mean("bits_per_byte")}});
    if (lead) {
      std::printf("Validation: %.3f bits per byte (uniform guessing: 8)\n",
                  eval.mean("bits_per_byte"));
      std::printf(
          "Bytes held by device 0: parameters %lld, optimizer state %lld (replicated: "
          "%lld and %lld)\n",
          static_cast<long long>(state.params.storage_bytes()),
          static_cast<long long>(state.opt_state.storage_bytes()),
          static_cast<long long>(4 * model.num_params()),
          static_cast<long long>(8 * model.num_params()));
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, device_program, {}, {},
                  {.backend = c.distributed.comm_backend()})(std::vector<Tensor>{});
  if (piped && c.run.timeline && !c.run.out_dir.empty()) {
    // Threads: every device's trace is here; MPI: this process's device only.
    std::vector<parallel::PipelineTrace> mine;
    std::vector<int> devices;
    for (std::size_t d = 0; d < traces.size(); ++d)
      if (traces[d].end > traces[d].start) {
        mine.push_back(traces[d]);
        devices.push_back(static_cast<int>(d));
      }
    if (!mine.empty()) {
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
  }
  return 0;
}

}  // namespace distjax::examples
