// TrainConfig: everything a training run reads, table by table as in the TOML files
// (run, model, optimizer, data, parallelism, distributed). docs/configs.md lists every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/config/distributed_config.hpp"

namespace distjax::config {

/// run.resume: whether a run continues from the checkpoints in out_dir (TOML false,
/// true or "auto"; the programs map it onto train::Resume).
enum class Resume : std::uint8_t {
  Off,       ///< false: start afresh (refused over checkpoints unless run.overwrite)
  Required,  ///< true: continue from the latest checkpoint; none is an error
  Auto,      ///< "auto": continue when there is a checkpoint, else start afresh
};

/// [run]: which program, how long, where the files go.
struct RunConfig {
  std::string program;                ///< the registered model (`distjax train --help` lists them)
  std::int64_t steps = 0;             ///< optimizer steps; 0 = epochs x steps per epoch
  std::int64_t epochs = 0;            ///< passes over the training set (models with epochs)
  std::int64_t batch_size = 128;      ///< global examples (sequences) per step
  std::int64_t grad_accum_steps = 1;  ///< gradient-accumulation slices per step
  std::int64_t log_every = 50;        ///< steps between progress lines / metrics records
  std::int64_t eval_every = 0;        ///< steps between evaluations; 0 = at the end only
  bool eval_at_start = false;         ///< evaluate before the first step too
  std::int64_t eval_batches = 8;      ///< validation batches per evaluation
  std::string out_dir = "runs/run";   ///< metrics.jsonl, summary.json (and checkpoints)
  std::int64_t checkpoint_every = 0;  ///< steps between checkpoints; 0 = none
  Resume resume = Resume::Off;        ///< continue from the latest checkpoint in out_dir
  bool overwrite = false;             ///< a fresh run removes out_dir's old checkpoints
  /// Checkpoint tensors a resume leaves out (train::LoadOptions::drop): globs on the
  /// tensor name or the parameter path, e.g. ["lm_head/*"].
  std::vector<std::string> resume_drop;
  std::int64_t seed = 0;              ///< initialisation, shuffling, dropout
  bool timeline = false;              ///< write out_dir/timeline.json (Chrome trace) of the last step
};

/// [model.moe]: Mixture-of-Experts MLPs in the GPT (nn::MoE), with experts > 0.
struct MoEConfig {
  std::int64_t experts = 0;  ///< E; 0 = no MoE layer (a dense GPT)
  std::int64_t top_k = 2;    ///< experts per token, 1..min(E, 8)
  std::int64_t every = 1;    ///< every n-th block's MLP is an MoE layer (blocks n-1, 2n-1, ...)
  std::int64_t hidden = 0;   ///< each expert's hidden width; 0 = 4 model.d_model
  std::string activation = "gelu";  ///< "gelu" (tanh form) or "swiglu" experts
  double capacity_factor = -1;      ///< -1 = dropless; > 0: capacity ceil(cf N k / E)
  std::string drop = "position";    ///< over capacity keep the first ("position") or "probability"
  bool renormalize = false;         ///< each token's k gates divided by their sum
  std::int64_t shared_experts = 0;  ///< a dense MLP of shared_experts x hidden beside them
  double aux_loss_coef = 0.01;      ///< weight of the load-balancing loss (Switch/GShard)
  double z_loss_coef = 0.001;       ///< weight of the router z-loss
  /// > 0: DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias in the selection,
  /// moved by this rate times the sign of its load error after each step (0 = off)
  double balance_bias_rate = 0;
  /// How tokens reach experts on other devices of the expert axis: "all_to_all" (their
  /// rows only) or "all_gather" (every device gathers the axis's tokens)
  std::string dispatcher = "all_to_all";
  /// all_to_all: the exchange in this many chunks, each overlapped with the experts'
  /// products on the one before (1 = none)
  std::int64_t exchange_chunks = 1;
  /// Expert tensor parallelism: each expert's hidden width split over the "model" axis (the
  /// megatron layout without sequence parallelism); off: the experts whole along it
  bool expert_tensor_parallel = false;
};

/// [model]: the classifier's and the GPT's sizes (each program reads its own).
struct ModelConfig {
  std::int64_t hidden = 512;   ///< classifier hidden width (D)
  std::int64_t layers = 4;     ///< TP classifier blocks / transformer blocks (L)
  double dropout = 0.1;        ///< dropout rate
  std::int64_t d_model = 128;  ///< transformer width (C)
  std::int64_t heads = 4;      ///< attention heads (H)
  /// Transformer vocabulary (V); 0 = the program's own (256 bytes for the text programs).
  /// Read by `distjax plan` (e.g. GPT-3's 50257); the training programs read bytes.
  std::int64_t vocab = 0;
  /// GPT programs: the output head is the token embedding (logits = x wte^T) instead of a
  /// separate lm_head. A choice of the model, the same on every mesh: a pipeline, whose
  /// first and last stages cannot share wte, refuses it.
  bool tie_embeddings = true;
  MoEConfig moe{};  ///< [model.moe]
};

/// [optimizer]: AdamW with linear warmup and cosine decay.
struct OptimizerConfig {
  double lr = 1e-3;                ///< peak learning rate
  double final_lr_ratio = 0.01;    ///< the cosine ends at lr x this
  std::int64_t warmup_steps = 20;  ///< linear warmup from 0
  double weight_decay = 0.01;      ///< decoupled (AdamW), not on biases and norms
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double max_grad_norm = 0.0;  ///< clip to this global norm; 0 = no clipping
};

/// [data]: where the data set is and how sequences are cut.
struct DataConfig {
  std::string dir;                    ///< "" = the program's default (Debian's data package)
  std::int64_t seq_len = 64;          ///< positions per sequence (T) for text
  double validation_fraction = 0.05;  ///< of a text corpus held out
  /// The GPT's text: "bytes" (the text files of `dir`, vocabulary 256) or "tokens" (the
  /// token shards of `train` and `val`, data::TokenShards; model.vocab above their ids).
  std::string format = "bytes";
  std::string train;             ///< tokens: a glob of the training shards
  std::string val;               ///< tokens: a glob of the validation shards
  /// tokens: several globs of training shards mixed in every global batch, each source's
  /// rows in proportion to `weights` (instead of `train`; data::mix_rows).
  std::vector<std::string> sources;
  std::vector<int> weights;  ///< relative weights of `sources`, integers >= 1; [] = equal
  std::int64_t token_bytes = 2;  ///< tokens: the width of raw (headerless) files, 2 or 4
  /// tokens: the byte-level BPE's tokenizer.json the shards were made with
  /// (tools/prepare_tokens.py); the evaluation then reports bits per byte too. "" = none.
  std::string tokenizer;
  /// The GPT's training windows: "random" (at uniform random offsets drawn from the step,
  /// data::sample_windows) or "epochs" (every window once per epoch, shuffled by run.seed,
  /// each data replica its own rows: data::WindowOrder).
  std::string order = "random";
  /// Make the next step's batch on a host thread while a step trains (data::Prefetcher),
  /// where the data of a step follows from the step (the GPT's text; a loader's batches,
  /// Fashion-MNIST's, are made by the step).
  bool prefetch = true;
  /// Packed documents: the end-of-text token id that ends each document of the text, or
  /// -1 (none). With it the GPT's loss counts no position whose input is the eot.
  std::int64_t eot = -1;
  /// With eot: the GPT's attention kept within each document (document ids from the eot
  /// tokens of each window). Not under a pipeline ("pipe" axis).
  bool document_attention = false;
};

/// parallelism.shard: what the data-parallel replicas split over "data" instead of each
/// holding it whole (ZeRO's stages; each includes the ones before).
enum class Shard : std::uint8_t {
  None,        ///< "none": plain data parallelism, the state replicated
  Optimizer,   ///< "optimizer": ZeRO-1, the optimizer state split
  Gradients,   ///< "gradients": ZeRO-2, and the gradients reduce-scattered
  Parameters,  ///< "parameters": ZeRO-3 / FSDP, and the parameters stored split
};
/// "none", "optimizer", "gradients" or "parameters".
const char* shard_name(Shard s);
/// ZeRO's stage of `s`: 0, 1, 2 or 3.
int zero_stage(Shard s);

/// [parallelism.fsdp]: which parameters shard = "parameters" stores split over "data" (read
/// with that shard only: another keeps the filter unused, so a file's filter stays valid
/// when --set parallelism.shard picks another).
struct FsdpConfig {
  /// Modules whose parameters are split: [] or ["*"] all, or the modules of these kinds
  /// (the toolkit's "Block", "Attn", "MLP"; nn::FullySharded::modules).
  std::vector<std::string> modules;
  std::int64_t min_weight_size = std::int64_t{1} << 18;  ///< smaller parameters stay replicated
};

/// [parallelism]: how the strategies split the model (the mesh is in DistributedConfig).
struct ParallelismConfig {
  Shard shard = Shard::None;           ///< what data parallelism splits over "data"
  std::string tp_layout = "megatron";  ///< megatron, gather, async or none
  bool sequence_parallel = false;      ///< megatron: split T between the blocks
  bool vocab_parallel = false;         ///< megatron: vocabulary-parallel head
  bool bidirectional = false;          ///< async rings both ways
  std::vector<std::string> remat;      ///< rematerialised modules: "Block", "Attn", "MLP"
  FsdpConfig fsdp;                     ///< the filter of shard = "parameters"
  /// Pipeline (distributed.pipeline_parallel_size > 1): the schedule, the micro-batches per
  /// step (they divide each data replica's batch) and the chunks per stage (interleaved).
  std::string schedule = "1f1b";       ///< gpipe, 1f1b, interleaved, zbh1 or interleaved_zb
  std::int64_t microbatches = 1;
  std::int64_t virtual_stages = 1;
  /// Context parallelism (distributed.context_parallel_size > 1): how the attention crosses
  /// the split of the sequence, "ring" or "ulysses", and whether the sequence is cut into
  /// 2 x cp chunks balanced for the causal mask (device r: chunks r and 2 cp - 1 - r).
  std::string context_parallel_method = "ring";
  bool context_balance = true;
};

/// A whole run. Built by load_config() (config/config_file.hpp) from defaults, a TOML file
/// and --set overrides; `distributed` is resolved against the environment by the program.
struct TrainConfig {
  RunConfig run;
  ModelConfig model;
  OptimizerConfig optimizer;
  DataConfig data;
  ParallelismConfig parallelism;
  DistributedConfig distributed;
  /// What reading the config noticed for the user: keys read under their old names, each
  /// with the new one (the programs print them before they run).
  std::vector<std::string> notices;

  /// One message per broken rule outside DistributedConfig (positive sizes, divisibility
  /// of the batch by data_parallel_size and grad_accum_steps, remat and fsdp module names)
  /// followed by distributed.problems(); call on a resolved config.
  std::vector<std::string> problems() const;
  /// Throws ConfigError "[config] <context>: N problems:\n  - ..." listing problems().
  void validate(const std::string& context = "") const;
};

}  // namespace distjax::config
