// The program of the GPT examples (fsdp, tensor_parallel_gpt): the GPT on the fortunes
// corpus over a ("data", "model") mesh of simulated devices, data parallel over "data"
// (optionally with fully sharded parameters, ZeRO-3 / FSDP, and remat), tensor parallel over
// "model" in any layout (Megatron, sequence and vocabulary parallel, gather, async rings).
// Prints the mesh, per-step loss, validation bits per byte and the bytes each device holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <string>

#include "distjax/data/text_corpus.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"
#include "example_common.hpp"

namespace distjax::examples {

using tensor::Tensor;
using tensor::TensorTree;

/// The defaults a program starts from (its flags override them).
struct GptExampleDefaults {
  long long data = 2, model = 4;
  std::string layout = "megatron";
  long long fsdp = 0;
};

inline int run_gpt_example(int argc, char** argv, const char* program,
                           const GptExampleDefaults& d) {
  Args args(program, "the GPT on the fortunes corpus over a (data, model) mesh");
  long long& n_data = args.flag("data", d.data, "devices along \"data\" (data parallel)");
  long long& n_model = args.flag("model", d.model, "devices along \"model\" (tensor parallel)");
  std::string& layout_name =
      args.flag("layout", d.layout, "tensor-parallel layout: megatron, gather, async or none");
  long long& sequence_parallel = args.flag("sequence-parallel", 0LL, "megatron: 1 = split T");
  long long& vocab_parallel =
      args.flag("vocab-parallel", 0LL, "megatron: 1 = vocabulary-parallel head");
  long long& bidirectional = args.flag("bidirectional", 0LL, "async: 1 = rings both ways");
  long long& fsdp_on = args.flag("fsdp", d.fsdp, "1 = parameters fully sharded over \"data\"");
  long long& steps = args.flag("steps", 200LL, "optimizer steps");
  long long& batch_size = args.flag("batch-size", 16LL, "global sequences per step");
  long long& seq_len = args.flag("seq-len", 64LL, "bytes per sequence (T)");
  long long& d_model = args.flag("d-model", 128LL, "model width (C)");
  long long& layers = args.flag("layers", 4LL, "transformer blocks (L)");
  long long& heads = args.flag("heads", 4LL, "attention heads (H)");
  long long& min_weight =
      args.flag("min-weight-size", 1LL << 14, "parameters with fewer elements stay replicated");
  double& lr = args.flag("lr", 3e-3, "peak learning rate of AdamW");
  long long& log_every = args.flag("log-every", 20LL, "steps between progress lines");
  std::string& out = args.flag("out", std::string("runs/") + program, "output directory");
  std::string& data_dir =
      args.flag("corpus", std::string(data::kFortunesDir), "directory of text files");
  std::string& backend_name =
      args.flag("backend", default_backend(),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  comm::Backend backend;
  if (!parse_backend(program, backend_name, &backend)) return 2;
  if (const long long np = mpi_world_size();
      backend == comm::Backend::Mpi && np > 0 && np != n_data * n_model) {
    std::fprintf(stderr, "%s: mpirun -np %lld does not match --data %lld x --model %lld\n", program,
                 np, n_data, n_model);
    return 2;
  }
  if (n_data < 1 || n_model < 1 || batch_size % n_data != 0 || heads % n_model != 0) {
    std::fprintf(stderr,
                 "%s: --batch-size %lld must be divisible by --data %lld and --heads %lld by "
                 "--model %lld\n",
                 program, batch_size, n_data, heads, n_model);
    return 2;
  }
  const parallel::TPLayout layout =
      n_model > 1 ? parallel::tp_layout_from_name(layout_name) : parallel::TPLayout::None;
  const mesh::Mesh mesh({static_cast<int>(n_data), static_cast<int>(n_model)}, {"data", "model"});
  if (main_process())
    std::printf("Mesh (%s backend, tensor parallel layout %s%s%s%s):\n%s\n", backend_name.c_str(),
                parallel::tp_layout_name(layout), sequence_parallel ? " + sequence parallel" : "",
                vocab_parallel ? " + vocabulary parallel" : "",
                fsdp_on ? ", parameters fully sharded over \"data\"" : "",
                mesh.to_string().c_str());

  const data::ByteCorpus corpus = data::load_fortunes(data_dir, 0.05);
  const std::vector<train::Batch> val =
      data::sequential_windows(corpus.validation, batch_size, seq_len, 4);
  const models::Transformer model(
      {.vocab = 256,
       .d_model = d_model,
       .num_layers = layers,
       .num_heads = heads,
       .max_len = seq_len,
       .remat = fsdp_on != 0,  // a block's gathered weights live only while it runs
       .tp = {.layout = layout,
              .sequence_parallel = sequence_parallel != 0,
              .vocab_parallel = vocab_parallel != 0,
              .bidirectional = bidirectional != 0}});
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(
                        0.0, lr, std::min<long long>(20, steps - 1), steps, lr * 0.1),
                    .b2 = 0.95,
                    .weight_decay = 0.1,
                    .decay_mask = optim::default_decay_mask()});
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = min_weight};
  const Key root = Key::from_seed(0);

  auto device_program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const bool lead = ctx.device() == 0;
    const int replica = ctx.axis_index("data");
    nn::ParamSpecs specs;
    parallel::DataParallel dp(ctx, "data", &specs);
    train::TrainState state = train::TrainState::create(
        model.init(root.fold_in(std::string_view("init")), &specs, &ctx, fsdp_on ? &fsdp : nullptr),
        opt, root.fold_in(std::string_view("dropout")), dp);
    auto loss_fn = [&](bool train) -> train::LossFn {
      return [&, train](const TensorTree& p, const train::Batch& b, Key k) {
        nn::Scope s = nn::Scope::apply(&p, train, k).on(ctx);
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
          layers, d_model, heads, seq_len, static_cast<long long>(model.num_params()),
          static_cast<long long>(state.params.num_elements()), static_cast<long long>(sharded),
          state.params.size());
    }
    train::Trainer trainer({.out_dir = lead ? out : std::string(),
                            .total_steps = steps,
                            .log_every = log_every,
                            .items_per_example = static_cast<double>(seq_len),
                            .items_name = "tokens",
                            .mesh = mesh.describe(),
                            .backend = backend_name,
                            .print = lead},
                           opt, loss_fn(true), {.max_grad_norm = 1.0, .strategy = &dp});
    const std::int64_t per = batch_size / n_data;
    const Key data_key = root.fold_in(std::string_view("data"));
    while (state.step < steps) {
      const train::Batch global =
          data::sample_windows(corpus.train, batch_size, seq_len,
                               data_key.fold_in(static_cast<std::uint64_t>(state.step)));
      trainer.step(state, global.slice(replica * per, (replica + 1) * per));
    }
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
  spmd::shard_map(mesh, device_program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  return 0;
}

}  // namespace distjax::examples
