// The GPT as a registered model: the Transformer on text (the bytes of a corpus, or token
// shards: data.format) over ("data", "context", "model"[, "pipe"]): data parallel or fully
// sharded over "data", its sequences split over "context" (ring attention or Ulysses), tensor
// parallel over "model" in any layout (Megatron, sequence and vocabulary parallel, gather,
// async rings), pipelined over "pipe" (models::TransformerPipeline under
// parallelism.schedule; model.tie_embeddings = false, as a pipeline cannot tie), or on one
// device without distributed.enabled, where it also samples text. The data of step s is
// drawn from s alone; validation in bits per byte or per token.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "distjax/app/detail/builtin_models.hpp"
#include "distjax/app/networks.hpp"
#include "distjax/app/run.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::app::detail {

using tensor::Tensor;

namespace {

void check_gpt(const config::TrainConfig& c, const mesh::Mesh& mesh) {
  const int n_model = mesh.has_axis("model") ? mesh.axis_size("model") : 1;
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
  if (c.distributed.context_parallel_size > 1) {
    const parallel::ContextPlan cp = context_parallel_of(c, mesh);
    const int n = cp.layout.size;
    DISTJAX_CHECK(cp.layout.divides(c.data.seq_len), ConfigError, "[gpt] data.seq_len = ",
                  c.data.seq_len, " does not split into ", cp.layout.chunks(),
                  " chunks: distributed.context_parallel_size = ", n,
                  c.parallelism.context_balance
                      ? " with parallelism.context_balance = true cuts the sequence in 2 x "
                        "context_parallel_size"
                      : "");
    DISTJAX_CHECK(!c.parallelism.sequence_parallel || layout != parallel::TPLayout::Megatron ||
                      (c.data.seq_len / n) % n_model == 0,
                  ConfigError, "[gpt] parallelism.sequence_parallel: each device's ",
                  c.data.seq_len / n, " positions (data.seq_len / context_parallel_size) must "
                  "be divisible by the \"model\" axis size ", n_model);
    DISTJAX_CHECK(cp.method != parallel::ContextMethod::Ulysses ||
                      (c.model.heads / n_model) % n == 0,
                  ConfigError, "[gpt] parallelism.context_parallel_method = \"ulysses\" splits "
                  "each device's ", c.model.heads / n_model, " heads (model.heads = ",
                  c.model.heads, " over the \"model\" axis of ", n_model,
                  ") over distributed.context_parallel_size = ", n, ", which must divide them");
    DISTJAX_CHECK(c.model.dropout == 0.0 || !c.parallelism.sequence_parallel ||
                      layout != parallel::TPLayout::Megatron,
                  NotImplemented, "[gpt] model.dropout = ", c.model.dropout,
                  " with parallelism.sequence_parallel and distributed.context_parallel_size = ",
                  n, ": the dropout of a sequence split twice is not drawn yet; set "
                  "model.dropout = 0 or sequence_parallel = false");
    DISTJAX_CHECK(!c.data.document_attention, NotImplemented,
                  "[gpt] data.document_attention with distributed.context_parallel_size = ", n,
                  ": the context-parallel attention keeps no document ids yet");
  }
  const int ep = c.distributed.expert_parallel_size;
  DISTJAX_CHECK(ep <= 1 || c.model.moe.experts > 0, ConfigError,
                "[gpt] distributed.expert_parallel_size = ", ep,
                " splits the experts of MoE layers, but the model has none: set [model.moe] "
                "experts (or expert_parallel_size = 1)");
  if (c.model.moe.experts > 0) {
    DISTJAX_CHECK(c.model.moe.experts % ep == 0, ConfigError, "[gpt] model.moe.experts = ",
                  c.model.moe.experts, " must be divisible by distributed.expert_parallel_size = ",
                  ep, " (each device of the \"expert\" axis holds the same number)");
    // The experts' grouped products run in f32 or bf16 (no f16 kernel).
    DISTJAX_CHECK(c.distributed.mixed_precision != config::MixedPrecision::Fp16, NotImplemented,
                  "[gpt] [model.moe] with distributed.mixed_precision = \"fp16\": the experts' "
                  "grouped products have no f16 kernel; use \"bf16\" (or \"no\")");
    if (c.model.moe.expert_tensor_parallel && n_model > 1) {
      const std::int64_t hidden =
          c.model.moe.hidden > 0 ? c.model.moe.hidden : 4 * c.model.d_model;
      DISTJAX_CHECK(hidden % n_model == 0, ConfigError,
                    "[gpt] model.moe.expert_tensor_parallel splits each expert's hidden width ",
                    hidden, " (model.moe.hidden) over distributed.tensor_parallel_size = ", n_model,
                    ", which must divide it");
    }
    if (c.model.moe.balance_bias_rate > 0) {
      // Every device moves its bias by the same loads: the step's, summed over the devices
      // that see other tokens; a sequence split over "model" would give each its own (with
      // the experts split over "model" too, the layer gathers the sequence first).
      DISTJAX_CHECK(
          !c.parallelism.sequence_parallel || n_model == 1 || c.model.moe.expert_tensor_parallel,
          NotImplemented,
          "[gpt] model.moe.balance_bias_rate with parallelism.sequence_parallel: the "
          "devices of the \"model\" axis would see different loads (unless "
          "model.moe.expert_tensor_parallel, which routes the gathered sequence)");
      DISTJAX_CHECK(c.parallelism.shard != config::Shard::Parameters ||
                        c.parallelism.fsdp.min_weight_size > c.model.moe.experts,
                    NotImplemented,
                    "[gpt] model.moe.balance_bias_rate with parallelism.shard = \"parameters\" "
                    "and parallelism.fsdp.min_weight_size = ", c.parallelism.fsdp.min_weight_size,
                    ": the balancing biases (", c.model.moe.experts,
                    " values each) would be stored split; raise min_weight_size above the "
                    "experts");
    }
  }
  if (n_pipe > 1) {
    DISTJAX_CHECK(c.parallelism.shard != config::Shard::Gradients, ConfigError,
                  "[gpt] parallelism.shard = \"gradients\" (ZeRO-2) with a \"pipe\" axis of ",
                  n_pipe, ": ZeRO-2 reduce-scatters inside its own backward pass, which the "
                  "pipeline's schedule replaces; use \"optimizer\" (ZeRO-1) or \"parameters\"");
    // The schedule and the split of the layers into chunks, as the pipeline builds them.
    const int v = static_cast<int>(c.parallelism.virtual_stages);
    parallel::make_schedule(parallel::parse_schedule_kind(c.parallelism.schedule), n_pipe,
                            static_cast<int>(c.parallelism.microbatches), v);
    parallel::partition_layers(static_cast<int>(c.model.layers), n_pipe * v);
  }
}

// Samples `n` bytes after `prompt` at temperature 0.8 from the whole model on one device:
// a look at what it learned.
std::string sample(const models::Transformer& model, const tensor::TensorTree& params,
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
    const float top = *std::max_element(last.begin(), last.begin() + 256);
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
  for (char& ch : text)
    if (ch == '\n') ch = ' ';
  return text;
}

}  // namespace

ModelSpec gpt_model() {
  return {
      .name = "gpt",
      .about =
          "the GPT on text (bytes or token shards) over (data, context, model[, pipe]): TP "
          "layouts, FSDP, pipelines, context parallelism, remat; one device without "
          "distributed.enabled",
      .axes = {"data", "model"},
      .capabilities = {.tensor_parallel = true,
                       .pipeline_parallel = true,
                       .context_parallel = true,
                       .expert_parallel = true,
                       .shards = {config::Shard::None, config::Shard::Optimizer,
                                  config::Shard::Gradients, config::Shard::Parameters},
                       .mixed_precision = true,
                       .fp16_pipeline = true,
                       .ties_embeddings = true},
      .check = check_gpt,
      .build = [](const config::TrainConfig& c, const mesh::Mesh&) {
        const auto text = std::make_shared<const TextData>(load_text(c));
        models::TransformerConfig config = transformer_config(c);
        config.tokens_per_byte = text->tokens_per_byte();  // BPE tokens: bits per byte too
        const auto gpt = std::make_shared<const models::Transformer>(config);
        const std::string unit = text->unit(), bits = "bits_per_" + unit;
        const bool per_byte = config.tokens_per_byte > 0;
        const double uniform = std::log2(static_cast<double>(gpt->config().vocab));
        Model m;
        m.network = transformer_network(gpt);
        char about[160];
        std::snprintf(about, sizeof about, "GPT L=%lld C=%lld H=%lld T=%lld (%.1f MFLOP/token)",
                      static_cast<long long>(c.model.layers),
                      static_cast<long long>(c.model.d_model),
                      static_cast<long long>(c.model.heads), static_cast<long long>(c.data.seq_len),
                      gpt->flops_per_token() / 1e6);
        m.description = about;
        if (config.moe_every > 0) {
          // The experts and the parameters a token's products use (what the FLOPs count).
          const config::MoEConfig& moe = c.model.moe;
          char more[160];
          std::snprintf(more, sizeof more,
                        ", MoE in %lld of %lld blocks: %lld experts, top-%lld, %s, "
                        "%.2fM parameters active per token",
                        static_cast<long long>(config.moe_layers()),
                        static_cast<long long>(c.model.layers),
                        static_cast<long long>(moe.experts), static_cast<long long>(moe.top_k),
                        moe.capacity_factor < 0 ? "dropless" : "with a capacity",
                        static_cast<double>(gpt->num_matmul_params()) / 1e6);
          m.description += more;
        }
        m.num_parameters = gpt->num_params();
        m.items_per_example = static_cast<double>(c.data.seq_len);
        m.items_name = "tokens";
        m.header = text->describe();
        m.header.push_back("Validation: " + text->validation_note());
        const Key data_key = Key::from_seed(static_cast<std::uint64_t>(c.run.seed))
                                 .fold_in(std::string_view("data"));
        m.data = [text, data_key](const DevicePlace& p) {
          DeviceData d;
          d.batch = [text, data_key, p](std::int64_t step) {
            return text->batch(step, p.replica, p.replicas, data_key);
          };
          for (const train::Batch& b : text->validation())
            d.eval.push_back(p.replicas > 1 ? replica_slice(b, p.replica, p.replicas) : b);
          return d;
        };
        m.summary = [bits, per_byte, flops = gpt->flops_per_token(),
                     at_start = c.run.eval_at_start](
                        const RunResult& r) -> std::map<std::string, double> {
          std::map<std::string, double> s = {{"val_" + bits, r.eval.mean(bits)},
                                             {"flops_per_token", flops}};
          if (per_byte) s["val_bits_per_byte"] = r.eval.mean("bits_per_byte");
          if (at_start) s["initial_val_" + bits] = r.initial_eval.mean(bits);
          return s;
        };
        m.report = [gpt, unit, bits, uniform, per_byte, c](
                       const RunResult& r, const train::TrainState& state, const DevicePlace& p) {
          char line[200];
          if (c.run.eval_at_start && !r.already_finished)
            std::snprintf(line, sizeof line,
                          "Validation: %.3f -> %.3f bits per %s (uniform guessing: %.1f)\n",
                          r.initial_eval.mean(bits), r.eval.mean(bits), unit.c_str(), uniform);
          else
            std::snprintf(line, sizeof line,
                          "Validation: %.3f bits per %s (uniform guessing: %.1f)\n",
                          r.eval.mean(bits), unit.c_str(), uniform);
          std::string out = line;
          if (per_byte) {  // "...(uniform guessing: 12.0); 1.234 bits per byte\n"
            out.pop_back();
            std::snprintf(line, sizeof line, "; %.3f bits per byte\n",
                          r.eval.mean("bits_per_byte"));
            out += line;
          }
          // The whole model is here on one device; a sample needs bytes (no tokenizer).
          if (p.ctx == nullptr && unit == "byte")
            out += "Sample: " +
                   sample(*gpt, state.params, "The ", 120, c.data.seq_len,
                          Key::from_seed(static_cast<std::uint64_t>(c.run.seed))
                              .fold_in(std::string_view("sample"))) +
                   "\n";
          return out;
        };
        return m;
      }};
}

}  // namespace distjax::app::detail
