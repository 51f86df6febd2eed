// What plan/plan.hpp plans: the model (its parameters, how its activations scale) and how
// it is trained (mesh, strategy, optimizer, precision, batch). Plain data; the planner and
// its private stage model (src/distjax/plan/detail/) both read it.
// Shape legend: b micro-batch, s sequence (T), h width (C), a heads, L layers, V vocabulary;
// mesh axes data (d), model (t), pipe (p).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distjax::plan {

/// How a parameter is split over the "model" axis (tensor parallelism): Column its last
/// dimension, Row the first of a kernel; the vocabulary, padded to a multiple of the axis
/// as Megatron pads it, VocabRow the rows of an embedding table (V, C), VocabColumn the
/// columns of a head's kernel (C, V). A Mixture-of-Experts layer's stacked experts are split
/// over the "expert" axis (first dimension) and, with expert tensor parallelism, their
/// hidden width over "model": ExpertColumn (E, C, H) its last dimension, ExpertRow (E, H, C)
/// its second.
enum class TPSplit : std::uint8_t {
  None,
  Column,
  Row,
  VocabRow,
  VocabColumn,
  ExpertColumn,
  ExpertRow
};
inline bool is_expert(TPSplit s) { return s == TPSplit::ExpertColumn || s == TPSplit::ExpertRow; }

/// One parameter of the model: path, global shape, split over "model", pipeline layer.
struct ParamInfo {
  std::string path;                 ///< "blocks/3/mlp/fc1/kernel"
  std::vector<std::int64_t> shape;  ///< global
  TPSplit split = TPSplit::None;
  int layer = -1;  ///< transformer block index (pipeline stages); -1 = none
  std::int64_t numel() const;
};

/// What one training step keeps and allocates beyond the state, per micro-batch, for one
/// device's share under tensor parallelism factor `t`:
///   a layer keeps  per token: h x (layer_replicated + layer_split / t) + layer_per_token
///                  + (a / t) x (layer_per_head + layer_per_head_seq x s)   bytes
///   (with t = 1, no tensor-parallel layout: h x layer_unsplit and no layer_per_token; with
///   sequence parallelism and t > 1: h x (layer_replicated_sp + layer_split_sp / t)),
///   the head keeps per token: V' x head_per_vocab + h x (head_replicated + head_split / t)
///   (V' = V, or V / t in the Megatron calibration), the stage's input h x stage_input.
/// Two calibrations exist (activation_model_megatron, activation_model_distjax); make_plan
/// runs each pipeline stage's schedule over these to find its peak.
struct ActivationModel {
  std::string name;  ///< "megatron-16bit", "distjax-f32"
  /// Per transformer layer, per token, in units of h: with t = 1; with t > 1 the
  /// replicated part (not split by t) and split part (divided by t); the same under
  /// sequence parallelism.
  double layer_unsplit = 0;
  double layer_replicated = 0;
  double layer_split = 0;
  double layer_replicated_sp = 0;
  double layer_split_sp = 0;
  /// Per layer, per token: bytes (t > 1), in units of a / t (attention row statistics)
  /// and of a s / t (scores).
  double layer_per_token = 0;
  double layer_per_head = 0;
  double layer_per_head_seq = 0;
  /// Per token at the head: units of V' and of h (logits, final norm); in units of V',
  /// what the head's backward adds before the saved logits are freed (their cotangent).
  double head_per_vocab = 0;
  double head_backward_per_vocab = 0;
  double head_replicated = 0;
  double head_split = 0;
  /// Per layer, per token, in units of h, kept under full recomputation (the block input).
  double layer_full_remat = 0;
  /// Per layer, per token, in units of h, kept under selective recomputation (the
  /// Megatron paper's 34/t: attention's s^2 terms recomputed); <= 0: not implemented.
  double layer_selective = 0;
  /// Per token, in units of h: the stage's input kept for its backward (the embedding's
  /// output on the first stage, the received activation on the others; divided by t under
  /// sequence parallelism), and what the embedding keeps besides under sequence and
  /// vocabulary parallelism.
  double stage_input = 0;
  double embed_sequence_parallel = 0;
  double embed_vocab_parallel = 0;
  /// Bytes per token of a pipeline micro-batch's token ids and labels (sliced in the step).
  double microbatch_per_token = 0;
  /// Cotangents of the residual stream, (b, s, h) each, alive while a layer's backward runs
  /// (the one arriving and the one it sends down).
  double cotangent_buffers = 0;
  /// Per layer, per token, in units of h: the cotangents a layer's backward holds beside
  /// its saved activations before it frees them, with t = 1 (no tensor-parallel layout)
  /// and split by t > 1.
  double layer_backward_unsplit = 0;
  double layer_backward_split = 0;
  /// Per layer, per token of a device's share, bytes in units of h (divided by t): what the
  /// attention across a context split keeps beyond the layer's own (context > 1), by ring
  /// attention and by Ulysses (the whole sequence of its heads, gathered and put in order).
  double layer_context_ring = 0;
  double layer_context_ulysses = 0;
  /// Receives a pipeline stage posts ahead per channel, (b, s, h) each.
  int receive_buffers = 0;
  /// Whether data parallelism all-reduces a copy of the gradients (DistJax's buckets)
  /// rather than the gradient buffer in place (Megatron's contiguous buffer).
  bool gradient_bucket_copy = false;
  /// Whether a backward returns fresh gradient tensors (DistJax's tape; a pipeline adds
  /// each micro-batch's into an accumulator of its own), counted in the activation peak,
  /// rather than adding into the persistent gradient buffer in place (Megatron's main_grad).
  bool step_gradients = false;
};

/// Megatron-LM's (Korthikanti et al. 2022, "Reducing Activation Recomputation"): per layer
/// s b h (34 + 5 a s / h) bytes with 16-bit activations, s b h (10 + 24/t + 5 a s/(h t))
/// under tensor parallelism, s b h (34/t + 5 a s/(h t)) with sequence parallelism,
/// 34 s b h / t with selective recomputation, 2 s b h with full recomputation (plus one
/// layer rebuilt in backward). Gradients in place, no transfer buffers counted.
ActivationModel activation_model_megatron();
/// DistJax's own kernels in f32 (measured on this implementation, tests/plan/plan_test.cpp
/// and tests/tools/distjax_plan_test.cpp): per layer 4 (16 h + 2 a) bytes per token with
/// t = 1, 4 (10 h + 12 h/t + 2 a/t) + 12 with the Megatron layout (the fused attention
/// keeps two statistics per head and row, no s^2 scores; the residual stream, norms and
/// MLP input stay replicated along "model"), 4 (4 h + 18 h / t) with sequence parallelism;
/// head 4 (V + h + h/t), and the logits' cotangent 4 V in its backward; the stage input
/// 4 h; 4 h per layer under remat (the block input); the gradients as fresh tensors; in a
/// layer's backward two residual cotangents and the MLP's two hidden ones, 4 (2 h + 8 h)
/// per token (t = 1) or 4 (2 h + 2 h / t), beside its saved activations; two receives
/// posted ahead per pipeline channel.
ActivationModel activation_model_distjax();

/// The GPT's Mixture-of-Experts layers (nn::MoE; experts = 0: none).
struct MoEShape {
  std::int64_t experts = 0;  ///< E
  std::int64_t top_k = 2;    ///< k
  std::int64_t hidden = 0;   ///< H, each expert's hidden width
  std::int64_t every = 1;    ///< blocks every-1, 2 every-1, ... are MoE layers
  bool swiglu = false;
  std::int64_t shared_hidden = 0;  ///< the shared dense MLP's hidden width (0: none)
  bool bias = false;               ///< the balancing bias router/bias
  /// < 0: dropless, planned at kDroplessPlanningFactor; > 0: each expert keeps at most
  /// ceil(capacity_factor N k / E) of a device's N tokens' pairs.
  double capacity_factor = -1;
  /// The all-gather dispatcher (every device gathers the axis's tokens) instead of the
  /// all-to-all exchange of the rows.
  bool all_gather_dispatcher = false;
  /// Expert tensor parallelism: each expert's hidden width split over "model".
  bool tensor_parallel = false;
  bool is_moe_layer(std::int64_t layer) const { return experts > 0 && (layer + 1) % every == 0; }
};

/// A dropless layer's rows on an expert axis are planned as if each device's experts took
/// this many times their balanced share (capacity factor 1.25): what a device receives
/// depends on the routing. A router far from balanced (one without a balancing loss) needs
/// more; a capacity factor bounds it.
inline constexpr double kDroplessPlanningFactor = 1.25;

/// What the model is: its parameters and how its activations scale.
struct ModelDescription {
  std::string name;  ///< "gpt", "classifier"
  std::vector<ParamInfo> params;
  /// Transformer sizes (0 for the classifier).
  std::int64_t vocab = 0, d_model = 0, layers = 0, heads = 0;
  /// Classifier sizes (0 for the transformer).
  std::int64_t in_features = 0, hidden = 0, num_classes = 0;
  MoEShape moe{};  ///< the GPT's MoE layers
  std::int64_t num_params() const;
  /// MoE layers among the blocks.
  std::int64_t moe_layers() const;
};

/// The GPT of models/transformer.hpp (learned positions, MLP 4h; tied embeddings, or an
/// untied "lm_head/kernel" (C, V) as the pipelined GPT has): the same paths and shapes as
/// Transformer::init, counted, not allocated. `vocab_parallel` splits "wte/embedding" (and
/// the untied head) over "model".
/// With `moe.experts` > 0 the MLP of every moe.every-th block is an MoE layer
/// ("blocks/i/moe/router/kernel" (C, E), its bias, "experts/fc1" (E, C, H), "experts/gate",
/// "experts/fc2" (E, H, C), a "shared" MLP).
ModelDescription describe_gpt(std::int64_t vocab, std::int64_t d_model, std::int64_t layers,
                              std::int64_t heads, std::int64_t max_len, bool vocab_parallel = false,
                              bool tied = true, const MoEShape& moe = {});
/// The Classifier of models/classifier.hpp: fc1 (F, hidden), fc2 (hidden, K) and biases.
ModelDescription describe_classifier(std::int64_t in_features, std::int64_t hidden,
                                     std::int64_t num_classes);

enum class Recompute : std::uint8_t { None, Selective, Full };
/// The pipeline schedules (parallel::ScheduleKind): "gpipe", "1f1b", "interleaved", "zbh1",
/// "interleaved_zb".
enum class PipeSchedule : std::uint8_t {
  GPipe,
  OneFOneB,
  Interleaved,
  ZeroBubble,
  InterleavedZeroBubble
};

/// How the model is trained: mesh, strategy, optimizer, precision, batch.
struct Setup {
  int data = 1, tensor = 1, pipe = 1;  ///< mesh sizes ("data", "model", "pipe")
  /// The "expert" axis (Mixture-of-Experts layers' experts split over it): carved out of the
  /// `data` devices, which it divides (they all see different examples; the mesh's "data"
  /// axis keeps data / expert). The experts' gradients are averaged over data / expert.
  int expert = 1;
  /// The "context" axis: each device holds s / context positions of every sequence; the
  /// gradients are averaged over data x context.
  int context = 1;
  /// Ulysses (all-to-all to a heads split) rather than ring attention across the context.
  bool context_ulysses = false;
  int zero_stage = 0;                  ///< 0 DP, 1 ZeRO-1, 2 ZeRO-2 (over "data")
  bool fsdp = false;                   ///< ZeRO-3 over "data"
  std::int64_t fsdp_min_weight_size = std::int64_t{1} << 18;
  bool sequence_parallel = false;  ///< Megatron sequence parallelism
  Recompute recompute = Recompute::None;
  PipeSchedule schedule = PipeSchedule::OneFOneB;
  std::int64_t microbatches = 1;  ///< pipeline micro-batches per step
  int virtual_stages = 1;         ///< chunks per stage (Interleaved)
  /// Optimizer state per parameter element in f32 slots: 2 AdamW, 1 SGD with momentum, 0.
  int optimizer_slots = 2;
  /// Bytes of a parameter, a gradient, an activation element (4 f32; 2 fp16 / bf16).
  int param_bytes = 4, grad_bytes = 4, activation_bytes = 4;
  /// Bytes of one optimizer-state element; with 16-bit parameters and `master_weights`, an
  /// f32 master copy (4 bytes per element) is counted in the optimizer state too.
  int state_bytes = 4;
  bool master_weights = false;
  std::int64_t global_batch = 1;  ///< sequences (examples) per step
  std::int64_t seq_len = 1;       ///< s (1 for the classifier)
  ActivationModel activations = activation_model_distjax();
  int world() const { return data * tensor * pipe * context; }
};

}  // namespace distjax::plan
