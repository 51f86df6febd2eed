// TrainConfig: the rules between the tables (the distributed ones are DistributedConfig's).
#include "distjax/config/train_config.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::config {
namespace {

template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::None: return "none";
    case Shard::Optimizer: return "optimizer";
    case Shard::Gradients: return "gradients";
    case Shard::Parameters: return "parameters";
  }
  return "?";
}

int zero_stage(Shard s) { return static_cast<int>(s); }

std::vector<std::string> TrainConfig::problems() const {
  std::vector<std::string> out;
  const std::pair<const char*, std::int64_t> positive[] = {
      {"run.batch_size", run.batch_size},
      {"run.grad_accum_steps", run.grad_accum_steps},
      {"run.log_every", run.log_every},
      {"run.eval_batches", run.eval_batches},
      {"model.hidden", model.hidden},
      {"model.layers", model.layers},
      {"model.d_model", model.d_model},
      {"model.heads", model.heads},
      {"data.seq_len", data.seq_len},
      {"parallelism.fsdp.min_weight_size", parallelism.fsdp.min_weight_size}};
  for (const auto& [name, v] : positive)
    if (v < 1) out.push_back(str(name, " = ", v, " must be positive"));
  const std::pair<const char*, std::int64_t> non_negative[] = {
      {"run.steps", run.steps},
      {"run.epochs", run.epochs},
      {"run.eval_every", run.eval_every},
      {"run.checkpoint_every", run.checkpoint_every},
      {"optimizer.warmup_steps", optimizer.warmup_steps},
      {"model.vocab", model.vocab}};
  for (const auto& [name, v] : non_negative)
    if (v < 0) out.push_back(str(name, " = ", v, " must not be negative"));
  if (run.program.empty()) out.push_back("run.program is not set");
  const MoEConfig& moe = model.moe;
  if (moe.experts < 0)
    out.push_back(str("model.moe.experts = ", moe.experts, " must not be negative (0 = no MoE)"));
  if (moe.experts > 0) {
    if (moe.top_k < 1 || moe.top_k > std::min<std::int64_t>(moe.experts, 8))
      out.push_back(str("model.moe.top_k = ", moe.top_k, " must be in [1, ",
                        std::min<std::int64_t>(moe.experts, 8), "] for model.moe.experts = ",
                        moe.experts));
    if (moe.every < 1 || moe.every > model.layers)
      out.push_back(str("model.moe.every = ", moe.every, " must be in [1, model.layers = ",
                        model.layers, "] (every n-th block's MLP is an MoE layer)"));
    if (!(moe.capacity_factor == -1 || moe.capacity_factor > 0))
      out.push_back(str("model.moe.capacity_factor = ", moe.capacity_factor,
                        " must be positive, or -1 for dropless routing"));
    if (moe.hidden < 0 || moe.shared_experts < 0)
      out.push_back(str("model.moe.hidden = ", moe.hidden, " and model.moe.shared_experts = ",
                        moe.shared_experts, " must not be negative"));
    for (const auto& [name, v] : {std::pair{"aux_loss_coef", moe.aux_loss_coef},
                                  std::pair{"z_loss_coef", moe.z_loss_coef},
                                  std::pair{"balance_bias_rate", moe.balance_bias_rate}})
      if (!(v >= 0) || !std::isfinite(v))
        out.push_back(str("model.moe.", name, " = ", v, " must be finite and not negative"));
    if (moe.exchange_chunks < 1 || moe.exchange_chunks > 64)
      out.push_back(str("model.moe.exchange_chunks = ", moe.exchange_chunks,
                        " must be in [1, 64]"));
    else if (moe.exchange_chunks > 1 && moe.dispatcher != "all_to_all")
      out.push_back(str("model.moe.exchange_chunks = ", moe.exchange_chunks,
                        " splits the all_to_all dispatcher's exchange; model.moe.dispatcher = \"",
                        moe.dispatcher, "\" has none (set 1, or dispatcher = \"all_to_all\")"));
  }
  if (run.steps == 0 && run.epochs == 0)
    out.push_back("run.steps and run.epochs are both 0: set one of them");
  // Every number must be finite (a TOML file or --set can spell nan and inf; a config built
  // in code can hold them): the rules below would let a NaN through, as comparisons with
  // NaN are false.
  const std::pair<const char*, double> reals[] = {
      {"optimizer.lr", optimizer.lr},
      {"optimizer.final_lr_ratio", optimizer.final_lr_ratio},
      {"optimizer.weight_decay", optimizer.weight_decay},
      {"optimizer.b1", optimizer.b1},
      {"optimizer.b2", optimizer.b2},
      {"optimizer.eps", optimizer.eps},
      {"optimizer.max_grad_norm", optimizer.max_grad_norm},
      {"model.dropout", model.dropout},
      {"data.validation_fraction", data.validation_fraction}};
  for (const auto& [name, v] : reals)
    if (!std::isfinite(v)) out.push_back(str(name, " = ", v, " must be a finite number"));
  if (optimizer.lr <= 0) out.push_back(str("optimizer.lr = ", optimizer.lr, " must be positive"));
  if (optimizer.final_lr_ratio < 0)
    out.push_back(
        str("optimizer.final_lr_ratio = ", optimizer.final_lr_ratio, " must not be negative"));
  if (optimizer.weight_decay < 0)
    out.push_back(
        str("optimizer.weight_decay = ", optimizer.weight_decay, " must not be negative"));
  if (optimizer.b1 < 0 || optimizer.b1 >= 1)
    out.push_back(str("optimizer.b1 = ", optimizer.b1, " must be in [0, 1)"));
  if (optimizer.b2 < 0 || optimizer.b2 >= 1)
    out.push_back(str("optimizer.b2 = ", optimizer.b2, " must be in [0, 1)"));
  // Adam divides by sqrt(v) + eps, and v is 0 wherever a gradient has been 0.
  if (optimizer.eps <= 0)
    out.push_back(str("optimizer.eps = ", optimizer.eps,
                      " must be positive (Adam divides by sqrt(v) + eps)"));
  if (optimizer.max_grad_norm < 0)
    out.push_back(str("optimizer.max_grad_norm = ", optimizer.max_grad_norm,
                      " must not be negative (0 = no clipping)"));
  if (model.dropout < 0 || model.dropout >= 1)
    out.push_back(str("model.dropout = ", model.dropout, " must be in [0, 1)"));
  if (data.validation_fraction <= 0 || data.validation_fraction >= 1)
    out.push_back(
        str("data.validation_fraction = ", data.validation_fraction, " must be in (0, 1)"));
  if (data.format == "tokens" && (data.train.empty() || data.val.empty()))
    out.push_back("data.format = \"tokens\" needs data.train and data.val (globs of token "
                  "shards)");
  if (data.format != "tokens" && (!data.train.empty() || !data.val.empty()))
    out.push_back(str("data.train and data.val are read with data.format = \"tokens\" only ",
                      "(it is \"", data.format, "\")"));
  if (data.format != "tokens" && !data.tokenizer.empty())
    out.push_back(str("data.tokenizer is read with data.format = \"tokens\" only (it is \"",
                      data.format, "\")"));
  if (data.token_bytes != 2 && data.token_bytes != 4)
    out.push_back(str("data.token_bytes = ", data.token_bytes, " must be 2 or 4"));
  const int dp = distributed.data_parallel_size();
  if (dp >= 1 && run.batch_size >= 1 && run.batch_size % dp != 0)
    out.push_back(str("run.batch_size = ", run.batch_size,
                      " must be divisible by the data-parallel size ", dp));
  if (dp >= 1 && run.batch_size >= 1 && run.grad_accum_steps >= 1 &&
      (run.batch_size / dp) % run.grad_accum_steps != 0)
    out.push_back(str("run.batch_size / data-parallel size = ", run.batch_size / dp,
                      " must be divisible by run.grad_accum_steps = ", run.grad_accum_steps));
  if (parallelism.microbatches < 1)
    out.push_back(str("parallelism.microbatches = ", parallelism.microbatches, " must be >= 1"));
  if (parallelism.virtual_stages < 1)
    out.push_back(str("parallelism.virtual_stages = ", parallelism.virtual_stages, " must be >= 1"));
  if (parallelism.virtual_stages > 1 && parallelism.schedule != "interleaved" &&
      parallelism.schedule != "interleaved_zb")
    out.push_back(str("parallelism.virtual_stages = ", parallelism.virtual_stages,
                      " needs parallelism.schedule = \"interleaved\" or \"interleaved_zb\" (got \"",
                      parallelism.schedule, "\")"));
  // Micro-batches split a replica's batch only under a pipeline (a "pipe" axis).
  const bool pipelined =
      distributed.pipeline_parallel_size > 1 ||
      std::find(distributed.mesh_axis_names.begin(), distributed.mesh_axis_names.end(), "pipe") !=
          distributed.mesh_axis_names.end();
  if (pipelined && dp >= 1 && run.batch_size >= 1 && run.grad_accum_steps >= 1 &&
      parallelism.microbatches >= 1 &&
      (run.batch_size / dp / run.grad_accum_steps) % parallelism.microbatches != 0)
    out.push_back(str("each replica's batch (run.batch_size / data-parallel size / "
                      "run.grad_accum_steps = ", run.batch_size / dp / run.grad_accum_steps,
                      ") must be divisible by parallelism.microbatches = ",
                      parallelism.microbatches));
  if (data.eot < -1)
    out.push_back(str("data.eot = ", data.eot, " must be a token id, or -1 for none"));
  if (data.document_attention && data.eot < 0)
    out.push_back("data.document_attention = true needs data.eot (the end-of-text token id)");
  if (run.out_dir.empty() && (run.checkpoint_every > 0 || run.resume != Resume::Off))
    out.push_back("run.out_dir is empty: checkpoints (run.checkpoint_every, run.resume) need it");
  if (run.overwrite && run.resume != Resume::Off)
    out.push_back(
        "run.overwrite = true and run.resume exclude each other (resume continues from "
        "the checkpoints that overwrite removes)");
  if (!run.resume_drop.empty() && run.resume == Resume::Off)
    out.push_back("run.resume_drop is set but run.resume = false: it applies only when resuming");
  for (const std::string& p : run.resume_drop)
    if (p.empty() || p.find_first_of(" \t\n") != std::string::npos)
      out.push_back("run.resume_drop item \"" + p +
                    "\" must be a non-empty glob without spaces (e.g. \"lm_head/*\")");
  for (std::string& p : distributed.problems())
    out.push_back("distributed: " + p);
  return out;
}

void TrainConfig::validate(const std::string& context) const {
  const std::vector<std::string> p = problems();
  if (p.empty()) return;
  std::ostringstream os;
  os << "[config] " << (context.empty() ? "" : context + ": ") << p.size()
     << (p.size() == 1 ? " problem:" : " problems:");
  for (const std::string& m : p)
    os << "\n  - " << m;
  throw ConfigError(os.str());
}

}  // namespace distjax::config
