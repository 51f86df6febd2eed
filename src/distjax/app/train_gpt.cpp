// Program train_gpt: the GPT-style Transformer on a byte-level corpus (the Debian fortune
// files) on one device (distributed.enabled = false), reporting validation loss in bits
// per byte and a sample of generated text; writes metrics.jsonl and summary.json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "distjax/app/model_specs.hpp"
#include "distjax/app/programs.hpp"
#include "distjax/app/run.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::app {

using tensor::Tensor;
using tensor::TensorTree;

namespace {

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
    // The last position's logits, read back for the host's draw.
    const std::vector<float> last = tensor::slice(logits, 1, t - 1, t).to_vector<float>();
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

}  // namespace

int run_train_gpt(const config::TrainConfig& c) {
  // The one device: distributed.device (a GPU with "cuda"), or DISTJAX_DEVICE's default.
  const DeviceScope on(c.distributed.placement());
  const std::int64_t steps = c.run.steps, batch_size = c.run.batch_size, seq_len = c.data.seq_len;
  const bool tokens = c.data.format == "tokens";
  const std::string source = tokens ? c.data.train + " / " + c.data.val
                             : c.data.dir.empty() ? data::kFortunesDir
                                                  : c.data.dir;
  const TextData text = load_text(c);
  const std::vector<train::Batch>& val = text.validation();
  const std::string bits = "bits_per_" + text.unit();
  const models::Transformer model(transformer_config(c));
  const optim::AdamW opt = make_adamw(c, steps);
  const Key root = Key::from_seed(static_cast<std::uint64_t>(c.run.seed));
  // One device, no mesh: the base strategy.
  Composed composed(c, nullptr, transformer_spec(model));
  train::TrainState state = composed.create_state(opt, root.fold_in(std::string_view("init")),
                                                  root.fold_in(std::string_view("dropout")));
  const Key data_key = root.fold_in(std::string_view("data"));
  std::printf("Corpus %s: %lld train / %lld validation %ss\n", source.c_str(),
              static_cast<long long>(text.train_size()),
              static_cast<long long>(text.validation_size()), text.unit().c_str());
  std::printf(
      "GPT L=%lld C=%lld H=%lld T=%lld: %lld parameters, %.1f MFLOP/token | %lld steps x %lld "
      "sequences\n",
      static_cast<long long>(c.model.layers), static_cast<long long>(c.model.d_model),
      static_cast<long long>(c.model.heads), static_cast<long long>(seq_len),
      static_cast<long long>(state.params.num_elements()), model.flops_per_token() / 1e6,
      static_cast<long long>(steps), static_cast<long long>(batch_size));
  std::printf("Validation: %s; uniform guessing is %.1f bits per %s\n",
              text.validation_note().c_str(), std::log2(static_cast<double>(model.config().vocab)),
              text.unit().c_str());
  std::printf("Precision: %s%s\n", composed.precision().str().c_str(),
              state.loss_scale ? ", dynamic loss scale" : "");
  const LoopResult r = run_loop(
      {.config = &c,
       .composed = &composed,
       .optimizer = &opt,
       .state = &state,
       .total_steps = steps,
       .log_every = c.run.log_every,
       .items_per_example = static_cast<double>(seq_len),
       .items_name = "tokens",
       .model_parameters = model.num_params(),
       // Each step's batch is drawn from the step.
       .batch = [&](std::int64_t step) {
         const Key key = data_key.fold_in(static_cast<std::uint64_t>(step));
         return text.sample(batch_size, seq_len, key);
       },
       .eval_batches = val,
       .eval_every = c.run.eval_every,
       .eval_at_start = true,
       .summary = [&](const LoopResult& r) -> std::map<std::string, double> {
         return {{"val_" + bits, r.eval.mean(bits)},
                 {"initial_val_" + bits, r.initial_eval.mean(bits)},
                 {"flops_per_token", model.flops_per_token()}};
       }});
  if (r.already_finished)
    std::printf("Validation bits per %s: %.3f\n", text.unit().c_str(), r.eval.mean(bits));
  else
    std::printf("Validation bits per %s: %.3f -> %.3f\n", text.unit().c_str(),
                r.initial_eval.mean(bits), r.eval.mean(bits));
  if (tokens) return 0;  // a sample needs the tokens' text (no tokenizer here)
  std::string sampled =
      sample(model, state.params, "The ", 120, seq_len, root.fold_in(std::string_view("sample")));
  for (char& ch : sampled)
    if (ch == '\n') ch = ' ';
  std::printf("Sample: %s\n", sampled.c_str());
  return 0;
}

}  // namespace distjax::app
