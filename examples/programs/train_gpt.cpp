// Program train_gpt: the GPT-style Transformer on a byte-level corpus (the Debian fortune
// files) on one device (distributed.enabled = false), reporting validation loss in bits
// per byte and a sample of generated text; writes metrics.jsonl and summary.json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <vector>

#include "distjax/data/text_corpus.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/trainer.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

namespace distjax::examples {

using tensor::Tensor;
using tensor::TensorTree;

namespace {

// Mean next-byte cross-entropy (nats) over B * T positions; metrics per byte:
// "loss" in nats and "bits_per_byte" = nats / ln 2.
train::LossFn make_gpt_loss(const models::Transformer& model, bool train, nn::Precision precision) {
  return [&model, train, precision](const TensorTree& params, const train::Batch& batch, Key rng) {
    const nn::Scope scope = nn::Scope::apply(&params, train, rng).with_precision(precision);
    Tensor logits = model(scope, batch.inputs);  // (B, T, 256)
    Tensor loss = tensor::mean(tensor::cross_entropy(logits, batch.labels));
    const double bytes = static_cast<double>(batch.labels.numel());
    const double nats = loss.item<double>();
    train::Metrics m;
    m.add("loss", nats * bytes, bytes);
    m.add("bits_per_byte", nats / std::numbers::ln2 * bytes, bytes);
    return std::make_pair(loss, m);
  };
}

// Samples `n` bytes after `prompt` at temperature 0.8: a look at what the model learned.
std::string sample(const models::Transformer& model, const TensorTree& params,
                   const std::string& prompt, int n, std::int64_t max_len, Key key) {
  tensor::NoGradGuard no_grad;
  std::string text = prompt;
  for (int i = 0; i < n; ++i) {
    const std::size_t start =
        text.size() > static_cast<std::size_t>(max_len) ? text.size() - max_len : 0;
    std::vector<std::int32_t> ids(text.begin() + start, text.end());
    for (auto& id : ids)
      id &= 0xff;
    const auto t = static_cast<std::int64_t>(ids.size());
    Tensor logits = model.apply(params, Tensor::from_vector(ids, {1, t}), false, Key());
    const float* last = logits.data<float>() + (t - 1) * 256;
    float top = last[0];
    for (int v = 1; v < 256; ++v)
      top = std::max(top, last[v]);
    std::vector<double> p(256);
    double total = 0;
    for (int v = 0; v < 256; ++v)
      total += p[v] = std::exp((last[v] - top) / 0.8);
    float u = 0;
    random_uniform(key.fold_in(static_cast<std::uint64_t>(i)), &u, 1);
    double acc = 0;
    int pick = 255;
    for (int v = 0; v < 256; ++v) {
      acc += p[v] / total;
      if (u < acc) {
        pick = v;
        break;
      }
    }
    text.push_back(static_cast<char>(pick));
  }
  return text;
}

// One device, no mesh: the base strategy, reporting the device's memory (summary.json's
// memory_bytes_per_device) as the distributed strategies do.
class OneDevice : public train::Strategy {
 public:
  MemoryStats* memory_stats() override { return &memory_; }

 private:
  MemoryStats memory_;
};

}  // namespace

int run_train_gpt(const config::TrainConfig& c) {
  auto has = [](const std::vector<std::string>& names, const char* name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  const std::int64_t steps = c.run.steps, batch_size = c.run.batch_size, seq_len = c.data.seq_len;
  const std::string data_dir = c.data.dir.empty() ? data::kFortunesDir : c.data.dir;
  data::ByteCorpus corpus = data::load_fortunes(data_dir, c.data.validation_fraction);
  const std::vector<train::Batch> val =
      data::sequential_windows(corpus.validation, batch_size, seq_len, c.run.eval_batches);
  models::Transformer model({.vocab = 256,
                             .d_model = c.model.d_model,
                             .num_layers = c.model.layers,
                             .num_heads = c.model.heads,
                             .max_len = seq_len,
                             .tied_embeddings = c.model.tie_embeddings,
                             .dropout = static_cast<float>(c.model.dropout),
                             .remat = has(c.parallelism.remat, "Block"),
                             .remat_attn = has(c.parallelism.remat, "Attn"),
                             .remat_mlp = has(c.parallelism.remat, "MLP")});
  const optim::AdamW opt = make_adamw(c, steps);
  const Key root = Key::from_seed(static_cast<std::uint64_t>(c.run.seed));
  train::TrainState state =
      train::TrainState::create(model.init(root.fold_in(std::string_view("init"))), opt,
                                root.fold_in(std::string_view("dropout")));
  const Key data_key = root.fold_in(std::string_view("data"));
  std::printf("Corpus %s: %zu train / %zu validation bytes\n", data_dir.c_str(),
              corpus.train.size(), corpus.validation.size());
  std::printf(
      "GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %.1f MFLOP/token | %lld steps x %lld "
      "sequences\n",
      static_cast<long long>(c.model.layers), static_cast<long long>(c.model.d_model),
      static_cast<long long>(c.model.heads), static_cast<long long>(seq_len),
      static_cast<long long>(state.params.num_elements()), model.flops_per_token() / 1e6,
      static_cast<long long>(steps), static_cast<long long>(batch_size));
  std::printf("Validation: %zu batches x %lld x %lld bytes; uniform guessing is 8 bits per byte\n",
              val.size(), static_cast<long long>(batch_size), static_cast<long long>(seq_len));

  const nn::Precision precision = precision_of(c);
  enable_loss_scale(c, state);
  std::printf("Precision: %s%s\n", precision.str().c_str(),
              state.loss_scale ? ", dynamic loss scale" : "");
  const train::LossFn train_loss = make_gpt_loss(model, true, precision);
  const train::LossFn eval_loss = make_gpt_loss(model, false, precision);
  // One device, no mesh: an empty layout. Each step's batch is drawn from the step.
  train::Checkpointer ckpt(checkpoint_config(c), {});
  const bool resumed = ckpt.restore(state).has_value();
  if (resumed)
    std::printf("Resumed from %s at step %lld\n", ckpt.config().dir.c_str(),
                static_cast<long long>(state.step));
  OneDevice one_device;
  train::Trainer trainer({.out_dir = c.run.out_dir,
                          .total_steps = steps,
                          .log_every = c.run.log_every,
                          .items_per_example = static_cast<double>(seq_len),
                          .items_name = "tokens",
                          .append = resumed,
                          .timeline_file = timeline_file(c, 0)},
                         opt, train_loss,
                         {.num_minibatches = static_cast<int>(c.run.grad_accum_steps),
                          .max_grad_norm = c.optimizer.max_grad_norm,
                          .strategy = &one_device});
  trainer.evaluate(state, val, eval_loss);
  const double initial_bpb = trainer.last_eval().at("bits_per_byte");
  const std::int64_t eval_every = c.run.eval_every > 0 ? c.run.eval_every : steps;
  while (state.step < steps) {
    trainer.step(state,
                 data::sample_windows(corpus.train, batch_size, seq_len,
                                      data_key.fold_in(static_cast<std::uint64_t>(state.step))));
    ckpt.maybe_save(state, {0, state.step});
    if (state.step % eval_every == 0 || state.step == steps)
      trainer.evaluate(state, val, eval_loss);
  }
  if (const std::string saved = ckpt.save(state, {0, state.step}); ckpt.config().saves)
    std::printf("Checkpoint: %s\n", train::find_checkpoint(ckpt.config().dir).value_or(saved).c_str());
  const double bpb = trainer.last_eval().at("bits_per_byte");
  trainer.finish(state, {{"val_bits_per_byte", bpb},
                         {"initial_val_bits_per_byte", initial_bpb},
                         {"flops_per_token", model.flops_per_token()}});
  std::printf("Validation bits per byte: %.3f -> %.3f\n", initial_bpb, bpb);
  std::string text =
      sample(model, state.params, "The ", 120, seq_len, root.fold_in(std::string_view("sample")));
  for (char& ch : text)
    if (ch == '\n') ch = ' ';
  std::printf("Sample: %s\n", text.c_str());
  return 0;
}

}  // namespace distjax::examples
