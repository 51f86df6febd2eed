// config_file: the schema (one entry per key: type, help, how to read and write it), the
// TOML walk that checks every key against it, overrides, nearest-key suggestions.
#include "distjax/config/config_file.hpp"

#include <toml++/toml.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <variant>

#include "distjax/core/error.hpp"

namespace distjax::config {
namespace {

using Value = std::variant<bool, std::int64_t, double, std::string, std::vector<std::int64_t>,
                           std::vector<std::string>>;

// A key's schema entry and its accessors. `set` receives a value of the entry's type and
// throws ConfigError (without location) for a value outside its choices or range.
struct Entry {
  ConfigKey key;
  std::function<void(TrainConfig&, const Value&)> set;
  std::function<Value(const TrainConfig&)> get;
  bool old = false;  // a key read under its old name: read, noticed, never listed or written
};

std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
}

std::string list_choices(const std::vector<std::string>& choices) {
  std::string out;
  for (std::size_t i = 0; i < choices.size(); ++i)
    out += (i ? ", " : "") + in_quotes(choices[i]);
  return out;
}

void check_choice(const std::string& key, const std::vector<std::string>& choices,
                  const std::string& v) {
  if (choices.empty() || std::find(choices.begin(), choices.end(), v) != choices.end()) return;
  std::string msg = key + " must be one of " + list_choices(choices) + ", got " + in_quotes(v);
  if (const std::string near = nearest_name(v, choices); !near.empty())
    msg += "; did you mean " + in_quotes(near) + "?";
  throw ConfigError(msg);
}

// An entry for a member reached by `access` (a lambda returning a reference into the
// config); its TOML type follows the member's C++ type.
template <class F>
Entry field(std::string name, F access, std::string help, std::vector<std::string> choices = {}) {
  using T = std::remove_reference_t<decltype(access(std::declval<TrainConfig&>()))>;
  Entry e;
  e.key = {name, ValueType::Bool, std::move(help), choices};
  if constexpr (std::is_same_v<T, bool>) {
    e.key.type = ValueType::Bool;
    e.set = [access](TrainConfig& c, const Value& v) { access(c) = std::get<bool>(v); };
    e.get = [access](const TrainConfig& c) { return Value(access(const_cast<TrainConfig&>(c))); };
  } else if constexpr (std::is_integral_v<T>) {
    e.key.type = ValueType::Int;
    e.set = [access, name](TrainConfig& c, const Value& v) {
      const std::int64_t x = std::get<std::int64_t>(v);
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max())
        throw ConfigError(name + " = " + std::to_string(x) + " is out of range");
      access(c) = static_cast<T>(x);
    };
    e.get = [access](const TrainConfig& c) {
      return Value(static_cast<std::int64_t>(access(const_cast<TrainConfig&>(c))));
    };
  } else if constexpr (std::is_floating_point_v<T>) {
    e.key.type = ValueType::Float;
    e.set = [access, name](TrainConfig& c, const Value& v) {
      const double x = std::get<double>(v);
      // TOML spells nan and inf; no key of a training run means either.
      if (!std::isfinite(x))
        throw ConfigError(name + " = " +
                          (std::isnan(x) ? "nan"
                           : x > 0       ? "inf"
                                         : "-inf") +
                          " must be a finite number");
      access(c) = x;
    };
    e.get = [access](const TrainConfig& c) { return Value(access(const_cast<TrainConfig&>(c))); };
  } else if constexpr (std::is_same_v<T, std::string>) {
    e.key.type = ValueType::String;
    e.set = [access, name, choices](TrainConfig& c, const Value& v) {
      check_choice(name, choices, std::get<std::string>(v));
      access(c) = std::get<std::string>(v);
    };
    e.get = [access](const TrainConfig& c) { return Value(access(const_cast<TrainConfig&>(c))); };
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    e.key.type = ValueType::IntList;
    e.set = [access, name](TrainConfig& c, const Value& v) {
      std::vector<int> out;
      for (std::int64_t x : std::get<std::vector<std::int64_t>>(v)) {
        if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
          throw ConfigError(name + ": " + std::to_string(x) + " is out of range");
        out.push_back(static_cast<int>(x));
      }
      access(c) = out;
    };
    e.get = [access](const TrainConfig& c) {
      const std::vector<int>& v = access(const_cast<TrainConfig&>(c));
      return Value(std::vector<std::int64_t>(v.begin(), v.end()));
    };
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    e.key.type = ValueType::StringList;
    e.set = [access, name, choices](TrainConfig& c, const Value& v) {
      for (const std::string& s : std::get<std::vector<std::string>>(v))
        check_choice(name + " item", choices, s);
      access(c) = std::get<std::vector<std::string>>(v);
    };
    e.get = [access](const TrainConfig& c) { return Value(access(const_cast<TrainConfig&>(c))); };
  }
  return e;
}

// An entry for an enum member written as one of `names` (index = enum value).
template <class E, class F>
Entry enum_field(std::string name, F access, std::string help, std::vector<std::string> names) {
  Entry e;
  e.key = {name, ValueType::String, std::move(help), names};
  e.set = [access, name, names](TrainConfig& c, const Value& v) {
    const std::string& s = std::get<std::string>(v);
    check_choice(name, names, s);
    access(c) = static_cast<E>(std::find(names.begin(), names.end(), s) - names.begin());
  };
  e.get = [access, names](const TrainConfig& c) {
    return Value(names[static_cast<std::size_t>(access(const_cast<TrainConfig&>(c)))]);
  };
  return e;
}

// run.resume: false, true or "auto" (a TOML boolean, or one of those as a string).
Entry resume_field() {
  const std::vector<std::string> names = {"false", "true", "auto"};
  Entry e;
  e.key = {"run.resume", ValueType::BoolOrString,
           "continue from the latest checkpoint in run.out_dir: false (start afresh), true (a "
           "checkpoint must be there), \"auto\" (resume when there is one)",
           names};
  e.set = [names](TrainConfig& c, const Value& v) {
    if (const bool* b = std::get_if<bool>(&v)) {
      c.run.resume = *b ? Resume::Required : Resume::Off;
      return;
    }
    const std::string& s = std::get<std::string>(v);
    check_choice("run.resume", names, s);
    c.run.resume = s == "auto" ? Resume::Auto : s == "true" ? Resume::Required : Resume::Off;
  };
  e.get = [](const TrainConfig& c) {
    return c.run.resume == Resume::Auto ? Value(std::string("auto"))
                                        : Value(c.run.resume == Resume::Required);
  };
  return e;
}

// run.program: the registered model a run trains. The six programs that came before the
// registry read as the model they ran, said.
Entry program_field() {
  Entry e = field(
      "run.program", [](TrainConfig& c) -> std::string& { return c.run.program; },
      "the registered model to train: classifier, tp_classifier, pp_classifier, gpt "
      "(or one a program registers: app::register_model)");
  e.set = [](TrainConfig& c, const Value& v) {
    static const std::pair<const char*, const char*> renamed[] = {
        {"train_mnist", "classifier"},
        {"data_parallelism", "classifier"},
        {"tensor_parallelism", "tp_classifier"},
        {"pipeline_parallelism", "pp_classifier"},
        {"train_gpt", "gpt"}};
    const std::string& name = std::get<std::string>(v);
    c.run.program = name;
    for (const auto& [before, now] : renamed)
      if (name == before) {
        c.run.program = now;
        c.notices.push_back(
            "run.program = \"" + name + "\" is read as run.program = \"" + now +
            "\", the model it trains: say that instead" +
            (name == std::string("train_gpt") ? " (one device: distributed.enabled = false)" : ""));
      }
  };
  return e;
}

// parallelism.zero_stage, parallelism.shard's old name: 1 and 2 read as "optimizer" and
// "gradients"; 0 (plain data parallelism, or ZeRO-3 with fsdp.modules) changes nothing.
Entry zero_stage_field() {
  Entry e;
  e.old = true;
  e.key = {"parallelism.zero_stage", ValueType::Int, "parallelism.shard's old name", {}};
  e.set = [](TrainConfig& c, const Value& v) {
    const std::int64_t z = std::get<std::int64_t>(v);
    if (z < 0 || z > 2)
      throw ConfigError("parallelism.zero_stage = " + std::to_string(z) +
                        " must be 0, 1 or 2; it is parallelism.shard's old name: say "
                        "parallelism.shard = \"none\", \"optimizer\", \"gradients\" or "
                        "\"parameters\"");
    if (z == 0) {
      c.notices.push_back(
          "parallelism.zero_stage = 0 is parallelism.shard's old name; it "
          "changes nothing (shard = \"" +
          std::string(shard_name(c.parallelism.shard)) + "\"): remove it");
      return;
    }
    const Shard s = z == 1 ? Shard::Optimizer : Shard::Gradients;
    if (c.parallelism.shard != Shard::None && c.parallelism.shard != s)
      throw ConfigError("parallelism.zero_stage = " + std::to_string(z) +
                        " (parallelism.shard's old name) contradicts parallelism.shard = \"" +
                        shard_name(c.parallelism.shard) + "\": say parallelism.shard = \"" +
                        shard_name(s) + "\" instead");
    c.parallelism.shard = s;
    c.notices.push_back("parallelism.zero_stage = " + std::to_string(z) +
                        " is read as parallelism.shard = \"" + shard_name(s) +
                        "\", its new name: say that instead");
  };
  e.get = [](const TrainConfig& c) {
    return Value(static_cast<std::int64_t>(std::min(zero_stage(c.parallelism.shard), 2)));
  };
  return e;
}

// Module names given to fsdp.modules while parallelism.shard stays "none": the old way of
// asking for fully sharded parameters (the filter alone turned it on). Read as that, said.
void read_old_fsdp(TrainConfig& c, bool gave_modules, bool gave_shard) {
  if (!gave_modules || gave_shard || c.parallelism.fsdp.modules.empty() ||
      c.parallelism.shard != Shard::None)
    return;
  c.parallelism.shard = Shard::Parameters;
  c.notices.push_back(
      "parallelism.fsdp.modules without parallelism.shard is read as parallelism.shard = "
      "\"parameters\" (the modules alone used to turn it on): say so");
}

#define DJ_ACCESS(member)        \
  [](TrainConfig & c) -> auto& { \
    return c.member;             \
  }

const std::vector<Entry>& schema() {
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> s;
    // [run]
    s.push_back(program_field());
    s.push_back(field("run.steps", DJ_ACCESS(run.steps),
                      "optimizer steps; 0 = run.epochs x steps per epoch"));
    s.push_back(field("run.epochs", DJ_ACCESS(run.epochs),
                      "passes over the training set (the classifiers; used when run.steps = 0)"));
    s.push_back(field("run.batch_size", DJ_ACCESS(run.batch_size),
                      "global examples (sequences) per step, split over \"data\""));
    s.push_back(field("run.grad_accum_steps", DJ_ACCESS(run.grad_accum_steps),
                      "gradient-accumulation slices per step"));
    s.push_back(field("run.log_every", DJ_ACCESS(run.log_every),
                      "steps between progress lines and metrics.jsonl records"));
    s.push_back(field("run.eval_every", DJ_ACCESS(run.eval_every),
                      "steps between evaluations; 0 = at the end (the classifiers: every epoch)"));
    s.push_back(field("run.eval_at_start", DJ_ACCESS(run.eval_at_start),
                      "evaluate once before the first step too (the report shows the change)"));
    s.push_back(field("run.eval_batches", DJ_ACCESS(run.eval_batches),
                      "validation batches per evaluation (text programs), spread over the "
                      "whole split (all of it where it fits)"));
    s.push_back(field("run.out_dir", DJ_ACCESS(run.out_dir),
                      "output directory: metrics.jsonl, summary.json, checkpoints"));
    s.push_back(field("run.checkpoint_every", DJ_ACCESS(run.checkpoint_every),
                      "steps between checkpoints; 0 = none"));
    s.push_back(resume_field());
    s.push_back(field("run.overwrite", DJ_ACCESS(run.overwrite),
                      "a fresh run (run.resume = false) removes the checkpoints in run.out_dir "
                      "instead of refusing to start"));
    s.push_back(field("run.resume_drop", DJ_ACCESS(run.resume_drop),
                      "checkpoint tensors a resume leaves out: globs on the tensor name or the "
                      "parameter path, e.g. [\"lm_head/*\"] (an untied head into a tied model)"));
    s.push_back(field("run.seed", DJ_ACCESS(run.seed), "seed of initialisation, data and dropout"));
    s.push_back(field("run.timeline", DJ_ACCESS(run.timeline),
                      "write Chrome traces (open in Perfetto) of compute, communication and idle "
                      "spans: timeline_device<d>.json per device (step phases), or for a "
                      "pipelined gpt timeline.json (every action of the last step)"));
    // [model]
    s.push_back(field("model.hidden", DJ_ACCESS(model.hidden), "classifier hidden width (D)"));
    s.push_back(field("model.layers", DJ_ACCESS(model.layers),
                      "TP classifier blocks, or transformer blocks (L)"));
    s.push_back(field("model.dropout", DJ_ACCESS(model.dropout), "dropout rate"));
    s.push_back(field("model.d_model", DJ_ACCESS(model.d_model), "transformer width (C)"));
    s.push_back(field("model.heads", DJ_ACCESS(model.heads), "attention heads (H)"));
    s.push_back(field("model.vocab", DJ_ACCESS(model.vocab),
                      "transformer vocabulary (V); 0 = the byte vocabulary (256)"));
    s.push_back(field("model.tie_embeddings", DJ_ACCESS(model.tie_embeddings),
                      "GPT: the output head is the token embedding wte (no lm_head); must be "
                      "false with a pipe axis"));
    // [model.moe]
    s.push_back(field("model.moe.experts", DJ_ACCESS(model.moe.experts),
                      "GPT: experts of each Mixture-of-Experts layer (E); 0 = none (dense)"));
    s.push_back(field("model.moe.top_k", DJ_ACCESS(model.moe.top_k),
                      "experts each token goes to, 1..min(E, 8)"));
    s.push_back(field("model.moe.every", DJ_ACCESS(model.moe.every),
                      "every n-th block's MLP is an MoE layer (blocks n-1, 2n-1, ...)"));
    s.push_back(field("model.moe.hidden", DJ_ACCESS(model.moe.hidden),
                      "each expert's hidden width; 0 = 4 model.d_model"));
    s.push_back(field("model.moe.activation", DJ_ACCESS(model.moe.activation),
                      "the experts' MLP: gelu (tanh form) or swiglu", {"gelu", "swiglu"}));
    s.push_back(field("model.moe.capacity_factor", DJ_ACCESS(model.moe.capacity_factor),
                      "-1 = dropless; > 0: each expert keeps at most ceil(cf N k / E) of a "
                      "device's N tokens' pairs"));
    s.push_back(field("model.moe.drop", DJ_ACCESS(model.moe.drop),
                      "over capacity an expert keeps its first pairs (position) or those of the "
                      "highest gates (probability)",
                      {"position", "probability"}));
    s.push_back(field("model.moe.renormalize", DJ_ACCESS(model.moe.renormalize),
                      "each token's k gates divided by their sum"));
    s.push_back(field("model.moe.shared_experts", DJ_ACCESS(model.moe.shared_experts),
                      "a dense MLP of shared_experts x hidden beside the routed experts"));
    s.push_back(field("model.moe.aux_loss_coef", DJ_ACCESS(model.moe.aux_loss_coef),
                      "weight of the load-balancing loss (Switch/GShard) in the objective"));
    s.push_back(field("model.moe.z_loss_coef", DJ_ACCESS(model.moe.z_loss_coef),
                      "weight of the router z-loss in the objective"));
    s.push_back(field("model.moe.balance_bias_rate", DJ_ACCESS(model.moe.balance_bias_rate),
                      "> 0: auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias in "
                      "the selection, moved by this rate times the sign of its load error after "
                      "each step; 0 = off"));
    s.push_back(field("model.moe.dispatcher", DJ_ACCESS(model.moe.dispatcher),
                      "how tokens reach the experts of other devices of the expert axis: their "
                      "rows only (all_to_all) or every device's tokens (all_gather)",
                      {"all_to_all", "all_gather"}));
    s.push_back(field("model.moe.exchange_chunks", DJ_ACCESS(model.moe.exchange_chunks),
                      "all_to_all: the exchange in this many chunks, each overlapped with the "
                      "experts' products on the one before; 1 = none"));
    s.push_back(field("model.moe.expert_tensor_parallel",
                      DJ_ACCESS(model.moe.expert_tensor_parallel),
                      "each expert's hidden width split over the \"model\" axis (megatron layout, "
                      "no sequence parallelism); false: the experts whole along it"));
    // [optimizer]
    s.push_back(field("optimizer.lr", DJ_ACCESS(optimizer.lr), "peak learning rate of AdamW"));
    s.push_back(field("optimizer.final_lr_ratio", DJ_ACCESS(optimizer.final_lr_ratio),
                      "the cosine schedule ends at lr x this"));
    s.push_back(field("optimizer.warmup_steps", DJ_ACCESS(optimizer.warmup_steps),
                      "linear warmup steps from 0"));
    s.push_back(field("optimizer.weight_decay", DJ_ACCESS(optimizer.weight_decay),
                      "decoupled weight decay (not on biases and norm scales)"));
    s.push_back(field("optimizer.b1", DJ_ACCESS(optimizer.b1), "Adam's first-moment decay"));
    s.push_back(field("optimizer.b2", DJ_ACCESS(optimizer.b2), "Adam's second-moment decay"));
    s.push_back(field("optimizer.eps", DJ_ACCESS(optimizer.eps), "Adam's epsilon"));
    s.push_back(field("optimizer.max_grad_norm", DJ_ACCESS(optimizer.max_grad_norm),
                      "clip gradients to this global norm; 0 = no clipping"));
    // [data]
    s.push_back(field("data.dir", DJ_ACCESS(data.dir),
                      "data directory; \"\" = the program's Debian data package"));
    s.push_back(field("data.seq_len", DJ_ACCESS(data.seq_len),
                      "positions (bytes or tokens) per sequence (T)"));
    s.push_back(field("data.validation_fraction", DJ_ACCESS(data.validation_fraction),
                      "fraction of a text corpus held out for validation"));
    s.push_back(field("data.format", DJ_ACCESS(data.format),
                      "the GPT's text: bytes (the files of data.dir) or tokens (the token shards "
                      "of data.train and data.val: llm.c's .bin or raw token files)",
                      {"bytes", "tokens"}));
    s.push_back(field("data.train", DJ_ACCESS(data.train),
                      "tokens: a glob of the training shards, e.g. \"data/train_*.bin\""));
    s.push_back(field("data.val", DJ_ACCESS(data.val), "tokens: a glob of the validation shards"));
    s.push_back(field("data.sources", DJ_ACCESS(data.sources),
                      "tokens: several globs of training shards mixed in every global batch "
                      "by data.weights (instead of data.train)"));
    s.push_back(field("data.weights", DJ_ACCESS(data.weights),
                      "relative weights of data.sources (integers >= 1; [] = equal): each "
                      "source's rows of every global batch"));
    s.push_back(field("data.token_bytes", DJ_ACCESS(data.token_bytes),
                      "tokens: the width of raw token files without llm.c's header, 2 or 4"));
    s.push_back(field("data.tokenizer", DJ_ACCESS(data.tokenizer),
                      "tokens: the byte-level BPE tokenizer.json the shards were made with "
                      "(tools/prepare_tokens.py); the evaluation adds bits per byte. \"\" = none"));
    s.push_back(field("data.order", DJ_ACCESS(data.order),
                      "the GPT's training windows: random (at random offsets drawn from the step) "
                      "or epochs (every window once per epoch, shuffled by run.seed, each data "
                      "replica reading its own rows)",
                      {"random", "epochs"}));
    s.push_back(field("data.prefetch", DJ_ACCESS(data.prefetch),
                      "make the next step's batch on a host thread while a step trains (where "
                      "the data of a step follows from the step: the GPT's text)"));
    s.push_back(field("data.eot", DJ_ACCESS(data.eot),
                      "the end-of-text token id between packed documents, -1 = none; the GPT's "
                      "loss then counts no position whose input is it"));
    s.push_back(field("data.document_attention", DJ_ACCESS(data.document_attention),
                      "with data.eot: the GPT's attention kept within each document of a window"));
    // [parallelism]
    s.push_back(enum_field<Shard>(
        "parallelism.shard", DJ_ACCESS(parallelism.shard),
        "what data parallelism splits over \"data\": none, optimizer (ZeRO-1), gradients "
        "(ZeRO-2), parameters (ZeRO-3 / FSDP, the modules of parallelism.fsdp.modules)",
        {"none", "optimizer", "gradients", "parameters"}));
    s.push_back(zero_stage_field());
    s.push_back(field("parallelism.tp_layout", DJ_ACCESS(parallelism.tp_layout),
                      "tensor-parallel layout over \"model\", applied to the model by the "
                      "composition (gpt: every one; tp_classifier: gather, async)",
                      {"megatron", "gather", "async", "none"}));
    s.push_back(field("parallelism.sequence_parallel", DJ_ACCESS(parallelism.sequence_parallel),
                      "megatron: split the sequence between blocks"));
    s.push_back(field("parallelism.vocab_parallel", DJ_ACCESS(parallelism.vocab_parallel),
                      "megatron: vocabulary-parallel embedding and head"));
    s.push_back(field("parallelism.bidirectional", DJ_ACCESS(parallelism.bidirectional),
                      "async tensor parallelism: rings in both directions"));
    s.push_back(field("parallelism.remat", DJ_ACCESS(parallelism.remat),
                      "rematerialised modules (activations recomputed in backward)",
                      {"Block", "Attn", "MLP"}));
    s.push_back(field("parallelism.schedule", DJ_ACCESS(parallelism.schedule), "pipeline schedule",
                      {"gpipe", "1f1b", "interleaved", "zbh1", "interleaved_zb"}));
    s.push_back(field("parallelism.microbatches", DJ_ACCESS(parallelism.microbatches),
                      "pipeline micro-batches per step (divide each replica's batch)"));
    s.push_back(field("parallelism.virtual_stages", DJ_ACCESS(parallelism.virtual_stages),
                      "pipeline chunks per stage (interleaved schedules)"));
    s.push_back(field("parallelism.context_parallel_method",
                      DJ_ACCESS(parallelism.context_parallel_method),
                      "how the attention crosses the \"context\" split: ring (keys and values "
                      "around a ring) or ulysses (all-to-all to a split of the heads)",
                      {"ring", "ulysses"}));
    s.push_back(field("parallelism.context_balance", DJ_ACCESS(parallelism.context_balance),
                      "the sequence in 2 x context_parallel_size chunks, device r holding r and "
                      "the mirror one (even causal work); false: one chunk per device"));
    s.push_back(field("parallelism.fsdp.modules", DJ_ACCESS(parallelism.fsdp.modules),
                      "the modules shard = \"parameters\" splits: [] or [\"*\"] all, or by kind "
                      "(\"Block\", \"Attn\", \"MLP\")",
                      {"*", "Block", "Attn", "MLP"}));
    s.push_back(field("parallelism.fsdp.min_weight_size",
                      DJ_ACCESS(parallelism.fsdp.min_weight_size),
                      "parameters with fewer elements stay replicated"));
    // [distributed]
    s.push_back(field("distributed.enabled", DJ_ACCESS(distributed.enabled),
                      "false: one device (world_size, tp and pp must be 1)"));
    s.push_back(field("distributed.world_size", DJ_ACCESS(distributed.world_size),
                      "devices in total; 0 = from the launcher, mesh_shape or tp x pp"));
    s.push_back(
        enum_field<BackendChoice>("distributed.backend", DJ_ACCESS(distributed.backend),
                                  "auto (mpi under a launcher, else threads), threads, mpi, nccl",
                                  {"auto", "threads", "mpi", "nccl"}));
    s.push_back(field("distributed.rank", DJ_ACCESS(distributed.rank),
                      "global rank of this process (the launcher's wins)"));
    s.push_back(field("distributed.local_rank", DJ_ACCESS(distributed.local_rank),
                      "rank on this node (the launcher's wins)"));
    s.push_back(field("distributed.num_nodes", DJ_ACCESS(distributed.num_nodes), "nodes"));
    s.push_back(field("distributed.num_processes_per_node",
                      DJ_ACCESS(distributed.num_processes_per_node),
                      "devices per node; 0 = world_size / num_nodes"));
    s.push_back(field("distributed.master_addr", DJ_ACCESS(distributed.master_addr),
                      "rendezvous address (MASTER_ADDR wins)"));
    s.push_back(field("distributed.master_port", DJ_ACCESS(distributed.master_port),
                      "rendezvous port (MASTER_PORT wins)"));
    s.push_back(field("distributed.tensor_parallel_size",
                      DJ_ACCESS(distributed.tensor_parallel_size), "size of the \"model\" axis"));
    s.push_back(field("distributed.pipeline_parallel_size",
                      DJ_ACCESS(distributed.pipeline_parallel_size), "size of the \"pipe\" axis"));
    s.push_back(field("distributed.context_parallel_size",
                      DJ_ACCESS(distributed.context_parallel_size),
                      "size of the \"context\" axis: the sequence split over it"));
    s.push_back(field("distributed.expert_parallel_size",
                      DJ_ACCESS(distributed.expert_parallel_size),
                      "size of the \"expert\" axis: the MoE layers' experts split over it, its "
                      "devices carved out of the data-parallel ones (it divides their number)"));
    s.push_back(field("distributed.mesh_shape", DJ_ACCESS(distributed.mesh_shape),
                      "explicit mesh sizes; [] = (data, expert, context, model, pipe) from the sizes"));
    s.push_back(field("distributed.mesh_axis_names", DJ_ACCESS(distributed.mesh_axis_names),
                      "one name per mesh_shape entry"));
    s.push_back(enum_field<MixedPrecision>("distributed.mixed_precision",
                                           DJ_ACCESS(distributed.mixed_precision),
                                           "compute precision: no (f32), bf16 (bf16 matmuls), fp16 "
                                           "(f16 matmuls, loss scale); f32 master weights",
                                           {"no", "fp16", "bf16"}));
    s.push_back(field("distributed.device", DJ_ACCESS(distributed.device),
                      "where tensors live: auto (cpu, or the DISTJAX_DEVICE environment "
                      "variable), cpu, checked (the checked device), cuda"));
    s.push_back(field("distributed.timeout_s", DJ_ACCESS(distributed.timeout_s),
                      "seconds a collective may wait for every device; past it each device of "
                      "the call fails naming the devices (under MPI, the hosts) missing"));
    return s;
  }();
  return entries;
}

#undef DJ_ACCESS

const Entry* find_entry(std::string_view key) {
  for (const Entry& e : schema())
    if (e.key.name == key) return &e;
  return nullptr;
}

// Whether `prefix` is a table of the schema ("run", "parallelism.fsdp").
bool is_table(std::string_view prefix) {
  for (const Entry& e : schema())
    if (e.key.name.size() > prefix.size() && e.key.name.compare(0, prefix.size(), prefix) == 0 &&
        e.key.name[prefix.size()] == '.')
      return true;
  return false;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions), in one flat
// table. Each unknown key runs it against every key of the schema: its allocations and the
// coverage tracing of its comparisons (which say nothing of the input's structure; the fuzz
// build leaves it untraced) kept the config fuzzer at 125 inputs/s, now about 700.
#if defined(__clang__)
__attribute__((no_sanitize("coverage")))
#endif
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size(), w = m + 1;
  std::vector<std::size_t> d((n + 1) * w);
  for (std::size_t i = 0; i <= n; ++i)
    d[i * w] = i;
  for (std::size_t j = 0; j <= m; ++j)
    d[j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      std::size_t x = std::min(std::min(d[(i - 1) * w + j], d[i * w + j - 1]) + 1,
                               d[(i - 1) * w + j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        x = std::min(x, d[(i - 2) * w + j - 2] + 1);
      d[i * w + j] = x;
    }
  return d[n * w + m];
}

// |a - b|: a lower bound of the edit distance of strings of lengths a and b.
std::size_t length_gap(std::size_t a, std::size_t b) {
  return a > b ? a - b : b - a;
}

std::string_view leaf(std::string_view key) {
  const auto dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

std::string unknown_key_message(std::string_view key, bool table) {
  std::string msg =
      std::string("unknown ") + (table ? "table " : "key ") + in_quotes(std::string(key));
  if (const std::string near = nearest_key(key); !near.empty())
    msg += "; did you mean " + in_quotes(near) + "?";
  return msg;
}

// Errors of one document, kept with their position so they print in file order.
struct LocatedError {
  std::uint32_t line, column;
  std::string text;
};

std::string located(const std::string& source, const toml::source_region& where,
                    const std::string& msg) {
  return "[config] " + source + ":" + std::to_string(where.begin.line) + ":" +
         std::to_string(where.begin.column) + ": " + msg;
}

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

// The node as the entry's type; nullopt when the TOML type does not fit (an integer fits a
// float key).
std::optional<Value> convert(const toml::node& n, ValueType type) {
  switch (type) {
    case ValueType::Bool:
      if (auto v = n.value_exact<bool>()) return Value(*v);
      return std::nullopt;
    case ValueType::Int:
      if (auto v = n.value_exact<std::int64_t>()) return Value(*v);
      return std::nullopt;
    case ValueType::Float:
      if (n.is_floating_point()) return Value(*n.value<double>());
      if (auto v = n.value_exact<std::int64_t>()) return Value(static_cast<double>(*v));
      return std::nullopt;
    case ValueType::String:
      if (auto v = n.value_exact<std::string>()) return Value(*v);
      return std::nullopt;
    case ValueType::BoolOrString:
      if (auto v = n.value_exact<bool>()) return Value(*v);
      if (auto v = n.value_exact<std::string>()) return Value(*v);
      return std::nullopt;
    case ValueType::IntList: {
      const toml::array* a = n.as_array();
      if (a == nullptr) return std::nullopt;
      std::vector<std::int64_t> out;
      for (const toml::node& x : *a) {
        auto v = x.value_exact<std::int64_t>();
        if (!v) return std::nullopt;
        out.push_back(*v);
      }
      return Value(out);
    }
    case ValueType::StringList: {
      const toml::array* a = n.as_array();
      if (a == nullptr) return std::nullopt;
      std::vector<std::string> out;
      for (const toml::node& x : *a) {
        auto v = x.value_exact<std::string>();
        if (!v) return std::nullopt;
        out.push_back(*v);
      }
      return Value(out);
    }
  }
  return std::nullopt;
}

// Checks and applies every key under `table` (dotted `prefix`), collecting errors.
void walk(TrainConfig& config, const toml::table& table, const std::string& prefix,
          const std::string& source, std::vector<LocatedError>& errors,
          std::vector<std::string>& given) {
  const auto add = [&](const toml::source_region& where, const std::string& msg) {
    errors.push_back({where.begin.line, where.begin.column, located(source, where, msg)});
  };
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      if (is_table(key)) {
        walk(config, *sub, key, source, errors, given);
      } else {
        add(k.source(), unknown_key_message(key, !find_entry(key)));
      }
      continue;
    }
    const Entry* e = find_entry(key);
    if (e == nullptr) {
      add(k.source(), is_table(key) ? in_quotes(key) + " is a table, not a key"
                                    : unknown_key_message(key, false));
      continue;
    }
    const std::optional<Value> v = convert(node, e->key.type);
    if (!v) {
      add(node.source(),
          key + " must be " + value_type_name(e->key.type) + ", got " + toml_type_name(node));
      continue;
    }
    try {
      e->set(config, *v);
      given.push_back(key);
    } catch (const ConfigError& err) {
      add(node.source(), err.what());
    }
  }
}

[[noreturn]] void throw_all(std::vector<LocatedError> errors) {
  std::stable_sort(errors.begin(), errors.end(), [](const LocatedError& a, const LocatedError& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  std::string msg;
  for (std::size_t i = 0; i < errors.size(); ++i)
    msg += (i ? "\n" : "") + errors[i].text;
  throw ConfigError(msg);
}

// `s` as a TOML basic string: quotes and backslashes escaped, and control characters as \uXXXX
// (a "\n" read from a file was printed raw before, which no TOML reader takes back).
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
      continue;
    }
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

void write_value(std::ostream& os, const Value& v) {
  std::visit(
      [&os](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const auto str = [](const std::string& s) { return toml_string(s); };
        if constexpr (std::is_same_v<T, bool>) {
          os << (x ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          os << x;
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[64];  // the shortest text that reads back as the same double
          const auto end = std::to_chars(buf, buf + sizeof buf, x).ptr;
          std::string s(buf, end);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
          os << s;
        } else if constexpr (std::is_same_v<T, std::string>) {
          os << str(x);
        } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
          os << "[";
          for (std::size_t i = 0; i < x.size(); ++i)
            os << (i ? ", " : "") << x[i];
          os << "]";
        } else {
          os << "[";
          for (std::size_t i = 0; i < x.size(); ++i)
            os << (i ? ", " : "") << str(x[i]);
          os << "]";
        }
      },
      v);
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::Bool:
      return "a boolean";
    case ValueType::Int:
      return "an integer";
    case ValueType::Float:
      return "a number";
    case ValueType::String:
      return "a string";
    case ValueType::IntList:
      return "an array of integers";
    case ValueType::StringList:
      return "an array of strings";
    case ValueType::BoolOrString:
      return "a boolean or a string";
  }
  return "?";
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> out;
    for (const Entry& e : schema())
      if (!e.old) out.push_back(e.key);
    return out;
  }();
  return keys;
}

std::string nearest_key(std::string_view key) {
  const std::size_t limit = std::max<std::size_t>(3, leaf(key).size() / 2);
  std::string best;
  std::size_t best_score = std::string::npos;
  for (const Entry& e : schema()) {
    // A key whose distance cannot be within the limit, nor below the best, is not measured:
    // a long unknown key then costs no distances at all.
    const std::size_t bound = std::min(length_gap(key.size(), e.key.name.size()),
                                       length_gap(leaf(key).size(), leaf(e.key.name).size()) + 1);
    if (bound > limit || bound >= best_score) continue;
    // A key under the wrong table ("model.lr") is one step from the right one.
    const std::size_t score =
        std::min(edit_distance(key, e.key.name), edit_distance(leaf(key), leaf(e.key.name)) + 1);
    if (score < best_score) {
      best_score = score;
      best = e.key.name;
    }
  }
  return best_score <= limit ? best : std::string();
}

std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(3, name.size() / 2);
  std::string best;
  std::size_t best_score = std::string::npos;
  for (const std::string& c : candidates) {
    const std::size_t bound = length_gap(name.size(), c.size());
    if (bound > limit || bound >= best_score) continue;
    if (const std::size_t d = edit_distance(name, c); d < best_score) {
      best_score = d;
      best = c;
    }
  }
  return best_score <= limit ? best : std::string();
}

void apply_toml(TrainConfig& config, std::string_view text, const std::string& source) {
  toml::table doc;
  try {
    doc = toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& err) {
    throw ConfigError(
        located(source, err.source(), "TOML syntax error: " + std::string(err.description())));
  }
  std::vector<LocatedError> errors;
  std::vector<std::string> given;
  walk(config, doc, "", source, errors, given);
  if (!errors.empty()) throw_all(errors);
  const auto gave = [&](const char* k) { return std::ranges::find(given, k) != given.end(); };
  read_old_fsdp(config, gave("parallelism.fsdp.modules"), gave("parallelism.shard"));
}

void apply_override(TrainConfig& config, std::string_view assignment) {
  const std::string what = "[config] --set " + std::string(assignment) + ": ";
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError(what + "expected key=value, e.g. run.steps=100");
  std::string key(assignment.substr(0, eq));
  std::string text(assignment.substr(eq + 1));
  const auto trim = [](std::string& s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
  };
  trim(key);
  trim(text);
  const Entry* e = find_entry(key);
  if (e == nullptr)
    throw ConfigError(what + (is_table(key) ? in_quotes(key) + " is a table, not a key"
                                            : unknown_key_message(key, false)));
  // The value in TOML syntax; lists may drop their brackets ("2,4") and strings their quotes.
  std::string toml_text = text;
  const bool list = e->key.type == ValueType::IntList || e->key.type == ValueType::StringList;
  if (list && (text.empty() || text.front() != '[')) {
    toml_text = "[";
    std::stringstream items(text);
    std::string item;
    for (bool first = true; std::getline(items, item, ','); first = false) {
      trim(item);
      if (e->key.type == ValueType::StringList && (item.empty() || item.front() != '"'))
        item = in_quotes(item);
      toml_text += (first ? "" : ", ") + item;
    }
    toml_text += "]";
  }
  std::optional<Value> v;
  try {
    const std::string doc_text = "v = " + toml_text;
    const toml::table doc = toml::parse(std::string_view(doc_text), std::string_view("--set"));
    v = convert(*doc.get("v"), e->key.type);
  } catch (const toml::parse_error&) {
  }
  if (!v && (e->key.type == ValueType::String || e->key.type == ValueType::BoolOrString)) {
    // A bare string is read as TOML reads a quoted one: bytes that are not UTF-8 are refused
    // (to_toml would print a document that no reader takes back).
    try {
      static_cast<void>(toml::parse("v = " + toml_string(text), std::string_view("--set")));
    } catch (const toml::parse_error& err) {
      throw ConfigError(what + key + " must be " + value_type_name(e->key.type) + ": " +
                        std::string(err.description()));
    }
    v = Value(text);
  }
  if (!v)
    throw ConfigError(what + key + " must be " + value_type_name(e->key.type) + ", got " +
                      in_quotes(text));
  try {
    e->set(config, *v);
  } catch (const ConfigError& err) {
    throw ConfigError(what + err.what());
  }
  read_old_fsdp(config, key == "parallelism.fsdp.modules", false);
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                        const TrainConfig& defaults) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    // A typo in the name: the nearest .toml file of the same directory.
    std::string hint;
    const std::filesystem::path p(path);
    const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& f : std::filesystem::directory_iterator(dir, ec))
      if (f.path().extension() == ".toml") names.push_back(f.path().filename().string());
    if (const std::string near = nearest_name(p.filename().string(), names); !near.empty())
      hint = "; did you mean " + (dir / near).string() + "?";
    throw IoError("[config] cannot read config file " + path + hint);
  }
  std::stringstream text;
  text << in.rdbuf();
  TrainConfig config = defaults;
  apply_toml(config, text.str(), path);
  for (const std::string& o : overrides)
    apply_override(config, o);
  return config;
}

std::string to_toml(const TrainConfig& config) {
  std::ostringstream os;
  std::string table;
  for (const Entry& e : schema()) {
    if (e.old) continue;
    const std::string& name = e.key.name;
    const auto dot = name.rfind('.');
    const std::string t = name.substr(0, dot);
    if (t != table) {
      os << (table.empty() ? "" : "\n") << "[" << t << "]\n";
      table = t;
    }
    os << name.substr(dot + 1) << " = ";
    write_value(os, e.get(config));
    os << "\n";
  }
  return os.str();
}

}  // namespace distjax::config
