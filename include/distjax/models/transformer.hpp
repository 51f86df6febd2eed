// Transformer: a GPT-style decoder-only language model.
// Shape legend: B batch, T sequence (<= max_len), C = d_model, V vocabulary, L layers.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/core/prng.hpp"
#include "distjax/nn/moe.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/tp_transformer_block.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

/// Tensor parallelism of the Transformer over one mesh axis (parallel/tp_layout.hpp): every
/// layout; sequence and vocabulary parallelism in the Megatron layout.
using TransformerTP = parallel::TPPlan;

struct TransformerConfig {
  std::int64_t vocab = 256;       // V
  std::int64_t d_model = 256;     // C
  std::int64_t num_layers = 4;    // L
  std::int64_t num_heads = 4;     // H, divides C
  std::int64_t mlp_ratio = 4;     // MLP hidden = mlp_ratio * C
  std::int64_t max_len = 128;     // longest T
  bool learned_positions = true;  // else fixed sinusoidal positions
  bool tied_embeddings = true;    // logits = x @ wte^T, else an untied lm_head
  float dropout = 0.f;            // on embeddings and residual branches
  bool remat = false;             // recompute each block's activations in backward
  bool remat_attn = false;        // only each block's attention (the toolkit's "Attn")
  bool remat_mlp = false;         // only each block's MLP (the toolkit's "MLP")
  /// Parallel blocks (GPT-J, PaLM): x + attn(ln1(x)) + mlp(ln1(x)), one fused projection
  /// in and one out (parallel::TPTransformerBlock::parallel); no "ln2".
  bool parallel_block = false;
  float ln_eps = 1e-5f;
  TransformerTP tp{};  // tensor parallelism (none by default)
  /// What a position of the text is ("byte", "token"): the loss's metric in bits is named
  /// "bits_per_<unit>".
  std::string unit = "byte";
  /// > 0 (token text of a byte-level BPE): the loss also reports "bits_per_byte", bits per
  /// token times this ratio of tokens to the bytes they spell (the validation set's,
  /// app::TextData::tokens_per_byte: exact on that set, an estimate on other batches).
  double tokens_per_byte = 0;
  /// Each position attends to earlier ones only (a language model); false: to every
  /// position (an encoder, e.g. a Vision Transformer).
  bool causal = true;
  /// 0: the inputs are token ids (B, T) looked up in "wte". > 0: vectors (B, T, F), F =
  /// input_features (e.g. image patches), projected to C by the Dense "input" (then no
  /// "wte": the head is not tied).
  std::int64_t input_features = 0;
  /// 0: the head gives next-position logits (B, T, V). > 0: a classifier: the mean over
  /// positions of ln_f(x) into the Dense "classifier" (C -> K): logits (B, K) against
  /// labels (B), and no "lm_head". Vectors in or classes out run without tensor
  /// parallelism or in the Megatron layout (with or without sequence parallelism),
  /// untied, without vocabulary parallelism.
  std::int64_t num_classes = 0;
  /// Packed documents (train::Batch::documents, data::pack_documents): every attention
  /// keeps each position within its document (the ids as tensor::attention's `segments`);
  /// false: the documents of a window see each other. Their loss counts no ignored label
  /// either way.
  bool document_attention = false;
  /// Context parallelism (cp.active(), inside shard_map): the tokens of a scope are this
  /// device's share of the sequence (cp.layout.shard of each window), the positions the
  /// global ones, and every attention crosses the split by cp.method. Not with document
  /// attention.
  parallel::ContextPlan cp{};
  /// Mixture-of-Experts: with moe_every = n > 0, the MLP of every n-th block (blocks n-1,
  /// 2n-1, ...) is `moe` ("blocks/<i>/moe/..."), and loss() adds the layers' balancing
  /// losses (nn::MoE) to the cross-entropy. One device's layout: no tensor layout, context
  /// split, parallel block or rematerialisation.
  std::int64_t moe_every = 0;
  nn::MoE moe{};
  /// Whether block i's MLP is the MoE layer.
  bool moe_block(std::int64_t i) const { return moe_every > 0 && (i + 1) % moe_every == 0; }
  /// The MoE layers.
  std::int64_t moe_layers() const { return moe_every > 0 ? num_layers / moe_every : 0; }
};

/// GPT: tokens (B, T) i32/i64 -> logits (B, T, V) f32 (with input_features, num_classes and
/// causal = false: an encoder of vectors into classes, e.g. a Vision Transformer).
///   x = wte(tokens) + positions[:T]; dropout
///   x = blocks/0..L-1 (pre-norm TransformerBlock, causal attention, GELU tanh MLP)
///   logits = ln_f(x) @ wte^T   (or lm_head Dense without bias when untied)
/// Parameters: "wte/embedding" (V, C), "wpe/embedding" (max_len, C) if learned,
/// "blocks/<i>/{ln1,ln2}/{scale,bias}", "blocks/<i>/attn/{qkv,out}/{kernel,bias}",
/// "blocks/<i>/mlp/{fc1,fc2}/{kernel,bias}", "ln_f/{scale,bias}", "lm_head/kernel"
/// (C, V) if untied. Init: embeddings N(0, 0.02) / N(0, 0.01), kernels lecun_normal,
/// residual output projections scaled by 1 / sqrt(2 L) (GPT-2).
///
/// With config.tp, a scope bound to a device (Scope::on(ctx), inside shard_map) holds and
/// runs this device's shards; the tokens are replicated along the model axis. The logits
/// are then (B, T, V) replicated, or (B, T, V/n) with tp.vocab_parallel: loss() handles
/// both.
///
///   models::Transformer gpt({.vocab = 256, .d_model = 128, .num_layers = 2});
///   TensorTree params = gpt.init(Key::from_seed(0));
///   Tensor logits = gpt.apply(params, tokens, /*train=*/false, Key{});
///   // Megatron tensor parallelism, inside shard_map on a mesh with a "model" axis:
///   models::Transformer tp({..., .tp = {.layout = parallel::TPLayout::Megatron}});
///   TensorTree shards = tp.init(Key::from_seed(0), nullptr, &ctx);   // this device's
///   Tensor loss = tp.loss(nn::Scope::apply(&shards, true, key).on(ctx), tokens, targets);

class Transformer {
 public:
  explicit Transformer(TransformerConfig config = {});

  /// Fresh parameters; the same key gives identical parameters on every run.
  TensorTree init(Key key) const;
  /// Same, recording the PartitionSpec of every sharded parameter into `*specs` (when
  /// given) and, with a device context, creating only this device's shards (the slices
  /// of the single-device parameters).
  /// With `fsdp` too, the parameters are stored fully sharded (nn::Scope::fully_sharded):
  /// apply them on a scope with the same configuration.
  TensorTree init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx = nullptr,
                  const nn::FullySharded* fsdp = nullptr) const;
  /// Logits for a batch of token ids; dropout only when `train`.
  Tensor apply(const TensorTree& params, const Tensor& tokens, bool train, Key dropout_key) const;
  /// The same forward on any scope. `documents`: a packed batch's document ids
  /// (train::Batch::documents; undefined: none), for the attention with
  /// config.document_attention.
  Tensor operator()(const nn::Scope& scope, const Tensor& tokens,
                    const Tensor& documents = Tensor()) const;
  /// Mean next-token cross-entropy of `tokens` (B, T) against `targets` (B, T): a scalar,
  /// replicated along the model axis (vocabulary-parallel when tp.vocab_parallel). A
  /// replicated head tied to the embedding (no tensor parallelism, or Megatron without
  /// vocabulary parallelism or sequence parallelism) computes it without the (B, T, V)
  /// logits (tensor::linear_cross_entropy_mean).
  /// With `documents` (a packed batch: train::Batch::documents), targets equal to
  /// train::kIgnoreLabel count nothing: the loss is the sum over the other positions
  /// divided by all B T (the same divisor on every data replica and micro-batch, so their
  /// mean is one device's), and the attention keeps to each document with
  /// config.document_attention.
  /// With MoE layers (moe_every), the loss includes their weighted balancing losses; on a
  /// sowing scope (nn::Scope::sowing) those losses and the layers' statistics are sown
  /// there too (the cross-entropy alone is the loss minus Sown::loss()).
  Tensor loss(const nn::Scope& scope, const Tensor& tokens, const Tensor& targets,
              const Tensor& documents = Tensor()) const;

  /// The forward in its three parts (operator() is head(blocks(embed(tokens)))), for
  /// pipelines that run them on different stages: tokens (B, T) -> residual stream
  /// (residual_shape); block i of the residual stream; residual stream -> logits.
  Tensor embed(const nn::Scope& scope, const Tensor& tokens) const;
  /// `documents`: a packed batch's document ids (B, T), for the attention with
  /// config.document_attention; or undefined.
  Tensor block(const nn::Scope& scope, int i, const Tensor& x,
               const Tensor& documents = Tensor()) const;
  Tensor head(const nn::Scope& scope, const Tensor& x) const;
  /// This device's shape of the residual stream between blocks: (B, T, C), (B, T, C/n)
  /// feature-sharded, (B, T/n, C) sequence parallel.
  Shape residual_shape(const nn::Scope& scope, std::int64_t batch, std::int64_t seq_len) const;
  /// The mean cross-entropy of logits from head() (vocabulary-parallel when split); with
  /// `documents`, as loss() counts a packed batch.
  Tensor loss_of_logits(const nn::Scope& scope, const Tensor& logits, const Tensor& targets,
                        const Tensor& documents = Tensor()) const;

  /// An input of `batch` x `seq_len` zeros: token ids (B, T) i32, or vectors (B, T, F) f32
  /// with input_features (what init runs the forward on).
  Tensor example_input(std::int64_t batch, std::int64_t seq_len) const;
  /// The (local) sequence length an init runs its example on, on device `ctx` (or none):
  /// one position per device of a tensor-parallel axis (sequence parallelism splits it),
  /// times two under a balanced context split (two chunks per device).
  std::int64_t init_seq_len(const spmd::DeviceContext* ctx) const;

  /// Parameter count the config gives (equals init(...).num_elements()).
  std::int64_t num_params() const;
  /// Number of elements of a parameter tree.
  static std::int64_t num_params(const TensorTree& params) { return params.num_elements(); }
  /// Parameters that take part in a token's matrix products: everything except the
  /// position table and, when untied, the input embedding (lookups cost no FLOPs); of an
  /// MoE layer, the router, the top_k experts a token goes to and the shared MLP.
  std::int64_t num_matmul_params() const;
  /// Training FLOPs per token at sequence length max_len: 6 N + 12 L C T (PaLM's
  /// estimate, forward + backward, N = num_matmul_params()).
  double flops_per_token() const { return flops_per_token(config_.max_len); }
  double flops_per_token(std::int64_t seq_len) const;

  const TransformerConfig& config() const { return config_; }

 private:
  // loss() without the MoE layers' balancing losses.
  Tensor cross_entropy_loss(const nn::Scope& scope, const Tensor& tokens, const Tensor& targets,
                            const Tensor& documents) const;

  TransformerConfig config_;
};

/// The private metric of expert g's load in the MoE layer whose balancing bias is at
/// `bias_path` (names starting with "_": summed with the metrics over micro-batches and
/// devices, not logged).
std::string moe_load_metric(const std::string& bias_path, std::int64_t g);

/// Adds what a pass of `config`'s model sowed to `metrics`: each MoE layer's statistics
/// ("aux_loss", "z_loss", "expert_load_max_over_mean", "dropped_fraction": their mean over
/// layers and devices) and its balancing bias's loads (moe_load_metric, summed).
void add_moe_metrics(const nn::Sown& sown, train::Metrics& metrics);

/// The names add_moe_metrics may add for `config` (none without MoE layers): what every
/// stage of a pipeline reports, as zeros where it holds none of the layers.
std::vector<std::string> moe_metric_names(const TransformerConfig& config);

/// The balancing biases' update after an optimizer step (nn::balance_bias_update) from the
/// step's metrics, for the MoE layers whose biases `params` holds (a pipeline stage holds
/// its own).
void moe_balance_biases(const TransformerConfig& config, tensor::TensorTree& params,
                        const train::Metrics& step);

}  // namespace distjax::models
