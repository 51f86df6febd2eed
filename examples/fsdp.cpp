// The GPT on the fortunes corpus with fully sharded parameters (ZeRO-3 / FSDP) over a
// ("data"=8) mesh of simulated devices: each device stores 1/8 of every large parameter
// and of its optimizer state, gathers a block's weights when the block runs and again
// when the backward pass recomputes it (remat). Optionally tensor parallel too
// (--model 2: FSDP x TP). Prints the mesh, per-step loss, validation bits per byte and
// the bytes each device holds.
//
//   ./build/fsdp [--data 8 --model 1 --steps 200 --min-weight-size 16384]
//   mpirun -np 8 ./build/fsdp                    (one process per device)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numbers>
#include <string>

#include "distjax/data/text_corpus.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

int run(int argc, char** argv) {
  examples::Args args("fsdp", "the GPT on the fortunes corpus with fully sharded parameters");
  long long& n_data = args.flag("data", 8LL, "devices along \"data\" (parameters sharded over it)");
  long long& n_model = args.flag("model", 1LL, "devices along \"model\" (Megatron TP)");
  long long& steps = args.flag("steps", 200LL, "optimizer steps");
  long long& batch_size = args.flag("batch-size", 16LL, "global sequences per step");
  long long& seq_len = args.flag("seq-len", 64LL, "bytes per sequence (T)");
  long long& d_model = args.flag("d-model", 128LL, "model width (C)");
  long long& layers = args.flag("layers", 4LL, "transformer blocks (L)");
  long long& heads = args.flag("heads", 4LL, "attention heads (H)");
  long long& min_weight = args.flag("min-weight-size", 1LL << 14,
                                    "parameters with fewer elements stay replicated");
  double& lr = args.flag("lr", 3e-3, "peak learning rate of AdamW");
  long long& log_every = args.flag("log-every", 20LL, "steps between progress lines");
  std::string& out = args.flag("out", std::string("runs/fsdp"), "output directory");
  std::string& data_dir =
      args.flag("corpus", std::string(data::kFortunesDir), "directory of text files");
  std::string& backend_name =
      args.flag("backend", std::string(std::getenv("OMPI_COMM_WORLD_SIZE") ? "mpi" : "threads"),
                "threads (simulated devices in this process) or mpi (one process per device)");
  args.parse(argc, argv);

  if (backend_name != "mpi" && backend_name != "threads") {
    std::fprintf(stderr, "fsdp: --backend must be threads or mpi, got %s\n", backend_name.c_str());
    return 2;
  }
  const comm::Backend backend = backend_name == "mpi" ? comm::Backend::Mpi : comm::Backend::Threads;
  if (backend == comm::Backend::Mpi)
    if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoll(n) != n_data * n_model) {
      std::fprintf(stderr, "fsdp: mpirun -np %s does not match --data %lld x --model %lld\n", n,
                   n_data, n_model);
      return 2;
    }
  if (n_data < 1 || n_model < 1 || batch_size % n_data != 0 || heads % n_model != 0) {
    std::fprintf(stderr,
                 "fsdp: --batch-size %lld must be divisible by --data %lld and --heads %lld by "
                 "--model %lld\n",
                 batch_size, n_data, heads, n_model);
    return 2;
  }
  const mesh::Mesh mesh({static_cast<int>(n_data), static_cast<int>(n_model)}, {"data", "model"});
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr || std::string(rank) == "0")
    std::printf("Mesh (%s backend):\n%s\n", backend_name.c_str(), mesh.to_string().c_str());

  const data::ByteCorpus corpus = data::load_fortunes(data_dir, 0.05);
  const std::vector<train::Batch> val =
      data::sequential_windows(corpus.validation, batch_size, seq_len, 4);
  const models::Transformer model(
      {.vocab = 256,
       .d_model = d_model,
       .num_layers = layers,
       .num_heads = heads,
       .max_len = seq_len,
       .remat = true,  // a block's gathered weights live only while it runs
       .tp = {.layout = n_model > 1 ? parallel::TPLayout::Megatron : parallel::TPLayout::None}});
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(0.0, lr, std::min<long long>(20, steps - 1), steps, lr * 0.1),
                    .b2 = 0.95,
                    .weight_decay = 0.1,
                    .decay_mask = optim::default_decay_mask()});
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = min_weight};
  const Key root = Key::from_seed(0);

  auto program = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    const bool lead = ctx.device() == 0;
    const int replica = ctx.axis_index("data");
    nn::ParamSpecs specs;
    parallel::DataParallel dp(ctx, "data", &specs);
    train::TrainState state = train::TrainState::create(
        model.init(root.fold_in(std::string_view("init")), &specs, &ctx, &fsdp), opt,
        root.fold_in(std::string_view("dropout")), dp);
    auto loss_fn = [&](bool train) -> train::LossFn {
      return [&, train](const TensorTree& p, const train::Batch& b, Key k) {
        const nn::Scope s = nn::Scope::apply(&p, train, k).on(ctx).fully_sharded(fsdp);
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
        if (spec.uses("data")) ++sharded;
      std::printf("GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %lld of %zu tensors "
                  "fully sharded over \"data\"\n",
                  layers, d_model, heads, seq_len, static_cast<long long>(model.num_params()),
                  static_cast<long long>(sharded), state.params.size());
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
      const train::Batch global = data::sample_windows(
          corpus.train, batch_size, seq_len, data_key.fold_in(static_cast<std::uint64_t>(state.step)));
      trainer.step(state, global.slice(replica * per, (replica + 1) * per));
    }
    // Every device evaluates every validation batch (the same gathers everywhere).
    const train::Metrics eval = train::evaluate(state.params, val, loss_fn(false), Key{});
    trainer.finish(state, {{"val_bits_per_byte", eval.mean("bits_per_byte")}});
    if (lead) {
      std::printf("Validation: %.3f bits per byte (uniform guessing: 8)\n",
                  eval.mean("bits_per_byte"));
      std::printf("Bytes held by device 0: parameters %lld, optimizer state %lld (replicated: "
                  "%lld and %lld)\n",
                  static_cast<long long>(state.params.storage_bytes()),
                  static_cast<long long>(state.opt_state.storage_bytes()),
                  static_cast<long long>(4 * model.num_params()),
                  static_cast<long long>(8 * model.num_params()));
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, program, {}, {}, {.backend = backend})(std::vector<Tensor>{});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp: %s\n", e.what());
    return 1;
  }
}
