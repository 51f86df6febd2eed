#include "distjax/models/transformer.hpp"

#include <cmath>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/embedding.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/positions.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::models {

Transformer::Transformer(TransformerConfig config) : config_(config) {
  const auto& c = config_;
  DISTJAX_CHECK(
      c.vocab > 0 && c.d_model > 0 && c.num_layers >= 0 && c.mlp_ratio > 0 && c.max_len > 0,
      ConfigError,
      "[Transformer] vocab, d_model, mlp_ratio, max_len must be > 0 and "
      "num_layers >= 0, got vocab=",
      c.vocab, " d_model=", c.d_model, " num_layers=", c.num_layers, " mlp_ratio=", c.mlp_ratio,
      " max_len=", c.max_len);
  DISTJAX_CHECK(c.num_heads > 0 && c.d_model % c.num_heads == 0, ConfigError,
                "[Transformer] d_model=", c.d_model,
                " is not divisible by num_heads=", c.num_heads);
  if (c.moe_every > 0) {
    c.moe.check(c.d_model);
    DISTJAX_CHECK(!c.parallel_block, NotImplemented,
                  "[Transformer] Mixture-of-Experts blocks run without parallel blocks");
  }
  DISTJAX_CHECK(c.moe_every >= 0, ConfigError, "[Transformer] moe_every must be >= 0, got ",
                c.moe_every);
  DISTJAX_CHECK(c.dropout >= 0.f && c.dropout < 1.f, ConfigError,
                "[Transformer] dropout must be in [0, 1), got ", c.dropout);
  DISTJAX_CHECK(c.input_features >= 0 && c.num_classes >= 0, ConfigError,
                "[Transformer] input_features and num_classes must be >= 0, got ", c.input_features,
                " and ", c.num_classes);
  if (c.input_features > 0 || c.num_classes > 0) {
    DISTJAX_CHECK(!c.tied_embeddings, ConfigError,
                  "[Transformer] input_features or num_classes: the head cannot be tied to a "
                  "token embedding; set tied_embeddings = false");
    DISTJAX_CHECK(
        (c.tp.layout == parallel::TPLayout::None || c.tp.layout == parallel::TPLayout::Megatron) &&
            !c.tp.vocab_parallel,
        NotImplemented,
        "[Transformer] input_features or num_classes run without tensor parallelism "
        "or in the Megatron layout without vocabulary parallelism, not layout \"",
        parallel::tp_layout_name(c.tp.layout), "\"",
        c.tp.vocab_parallel ? " with vocab_parallel" : "");
  }
}

namespace {

// The config's MoE layer as a block runs it: the experts' hidden width mlp_ratio C unless
// given, the output projections scaled as the dense blocks' (GPT-2's 1 / sqrt(2 L)).
nn::MoE moe_of(const TransformerConfig& c) {
  nn::MoE moe = c.moe;
  if (moe.hidden == 0) moe.hidden = c.mlp_ratio * c.d_model;
  moe.out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(c.num_layers, 1)));
  return moe;
}

// What the tensor-parallel layout means for the embedding, the residual stream and the head.
struct Layout {
  bool megatron, feature_sharded, sp, vocab_parallel;
  int n;  // devices along the model axis (1 without tensor parallelism)
  mesh::Axes axis;
  mesh::PartitionSpec table_spec;  // of the embedding tables
};

// Whether the sequence is split over the context axis on this scope (config.cp active; a
// scope on a device is then required).
bool context_split(const TransformerConfig& c, const nn::Scope& scope) {
  if (!c.cp.active()) return false;
  DISTJAX_CHECK(scope.context() != nullptr, InvalidArgument, "[Transformer] \"", scope.path(),
                "\": context parallelism over \"", c.cp.axis,
                "\" runs on a scope bound to a device (Scope::on)");
  return true;
}

Layout layout_of(const TransformerConfig& c, const nn::Scope& scope) {
  using parallel::TPLayout;
  const TransformerTP& tp = c.tp;
  Layout l;
  l.megatron = tp.layout == TPLayout::Megatron;
  l.feature_sharded = tp.layout == TPLayout::Gather || tp.layout == TPLayout::Async;
  l.sp = l.megatron && tp.sequence_parallel;
  l.vocab_parallel = l.megatron && tp.vocab_parallel;
  l.axis = mesh::Axes(tp.axis);
  l.n = tp.layout == TPLayout::None ? 1 : scope.axis_size(l.axis);
  // Feature-sharded layouts split the embedding tables by columns, the vocabulary-parallel
  // one by rows; otherwise they are replicated.
  l.table_spec = l.feature_sharded ? mesh::P(std::nullopt, tp.axis) : mesh::PartitionSpec();
  return l;
}

}  // namespace

namespace {

// The rows of x (B, T, K) -> (N, K) and of targets (B, T) -> (N) of a packed batch (its
// documents defined) at the positions the loss counts (targets not train::kIgnoreLabel),
// and N / (B T), what their mean is scaled by so that the loss is their sum over all B T
// positions. All of them, as they are, for a batch that packs no documents (scale 1).
//
// Over all positions, not the counted ones: every data replica and accumulated
// micro-batch then divides by the same B T, and their mean is one device's loss over the
// global batch, however the documents' ends fall (a mean over each one's own count would
// weigh a replica with more of them more).
struct Counted {
  Tensor x, targets;
  double scale = 1.0;
};
Counted counted_rows(const Tensor& documents, const Tensor& x, const Tensor& targets) {
  if (!documents.defined() || targets.rank() != 2) return {x, targets};
  const std::vector<std::int64_t> labels =
      tensor::astype(targets, DType::I64).to(Device::cpu()).to_vector<std::int64_t>();
  std::vector<std::int32_t> rows;
  std::vector<std::int64_t> kept;
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] != train::kIgnoreLabel) {
      rows.push_back(static_cast<std::int32_t>(i));
      kept.push_back(labels[i]);
    }
  if (rows.size() == labels.size()) return {x, targets};
  DISTJAX_CHECK(!rows.empty(), InvalidArgument,
                "[Transformer] every label of the batch is ignored (each position's input ends a "
                "document): the loss counts none");
  const std::int64_t n = static_cast<std::int64_t>(rows.size()), k = x.size(x.rank() - 1);
  // embedding() is a row gather whose backward scatter-adds into x's gradient.
  return {tensor::embedding(tensor::reshape(x, {x.size(0) * x.size(1), k}),
                            Tensor::from_vector(rows, {n}, x.device())),
          tensor::astype(Tensor::from_vector(kept, {n}, targets.device()), targets.dtype()),
          static_cast<double>(n) / static_cast<double>(labels.size())};
}

}  // namespace

Tensor Transformer::operator()(const nn::Scope& scope, const Tensor& tokens,
                               const Tensor& documents) const {
  Tensor x = embed(scope, tokens);
  for (std::int64_t i = 0; i < config_.num_layers; ++i)
    x = block(scope, static_cast<int>(i), x, documents);
  return head(scope, x);
}

Tensor Transformer::embed(const nn::Scope& scope, const Tensor& tokens) const {
  const auto& c = config_;
  tensor::check_defined(tokens, "Transformer", "tokens");
  if (c.input_features > 0)
    DISTJAX_CHECK(
        tokens.rank() == 3 && tokens.size(2) == c.input_features && tokens.dtype() == DType::F32,
        InvalidArgument, "[Transformer] expected inputs (B, T, ", c.input_features,
        ") of f32, got ", tokens.str(0));
  else
    DISTJAX_CHECK(
        tokens.rank() == 2 && (tokens.dtype() == DType::I32 || tokens.dtype() == DType::I64),
        InvalidArgument, "[Transformer] expected tokens (B, T) of i32/i64, got ", tokens.str(0));
  const std::int64_t t_len = tokens.size(1);
  // Under context parallelism the tokens are this device's share of a longer sequence.
  const bool cp = context_split(c, scope);
  const std::int64_t t_all = cp ? t_len * c.cp.layout.size : t_len;
  DISTJAX_CHECK(t_len >= 1 && t_all <= c.max_len, InvalidArgument, "[Transformer] sequence length ",
                t_all, " is outside [1, max_len=", c.max_len, "]");
  const TransformerTP& tp = c.tp;
  const Layout l = layout_of(c, scope);
  spmd::DeviceContext* ctx = scope.context();
  DISTJAX_CHECK(!l.sp || t_len % l.n == 0, ShardingError,
                "[Transformer] sequence parallelism: T=", t_len, " is not divisible by ", tp.axis,
                "=", l.n);
  const nn::Embedding wte{.num_embeddings = c.vocab,
                          .features = c.d_model,
                          .embedding_init = nn::normal(0.02),
                          .embedding_spec = l.table_spec};
  const parallel::VocabParallelEmbedding wte_vp{
      .num_embeddings = c.vocab, .features = c.d_model, .axis = tp.axis};
  Tensor x;  // (B, T, C); (B, T/n, C) sequence parallel; (B, T, C/n) feature-sharded
  if (c.input_features > 0) {
    x = nn::Dense{.features = c.d_model}(scope.child("input"), tokens);
    if (l.sp) x = parallel::split_to_sp_region(ctx, x, l.axis, 1);
  } else if (l.vocab_parallel) {
    x = wte_vp(scope.child("wte"), tokens, l.sp);
  } else {
    x = wte(scope.child("wte"), tokens);
    if (l.sp) x = parallel::split_to_sp_region(ctx, x, l.axis, 1);
  }
  Tensor pos;  // (T, C), split like x
  if (c.learned_positions) {
    const nn::Embedding wpe{.num_embeddings = c.max_len,
                            .features = c.d_model,
                            .embedding_init = nn::normal(0.01),
                            .embedding_spec = l.table_spec};
    pos = tensor::slice(wpe.table(scope.child("wpe")), 0, 0, t_all);
  } else {
    pos = nn::sinusoidal_positions(t_all, c.d_model);
    if (l.feature_sharded && l.n > 1) {
      const std::int64_t w = c.d_model / l.n, i = scope.axis_index(l.axis);
      pos = tensor::slice(pos, 1, i * w, (i + 1) * w);
    }
  }
  // This device's positions: its chunks of the sequence, then its part of those under SP.
  if (cp) pos = c.cp.layout.shard(pos, 0, scope.axis_index(c.cp.axis));
  if (l.sp) pos = parallel::split_to_sp_region(ctx, pos, l.axis, 0);
  x = tensor::add(x, pos);
  const mesh::PartitionSpec x_spec = l.feature_sharded
                                         ? mesh::P(std::nullopt, std::nullopt, tp.axis)
                                     : l.sp ? mesh::P(std::nullopt, tp.axis)
                                            : mesh::PartitionSpec();
  nn::Dropout drop{.rate = c.dropout, .spec = x_spec};
  if (cp) drop = parallel::context_dropout(drop, ctx, c.cp, t_len);
  return drop(scope.child("embed_dropout"), x);
}

Tensor Transformer::block(const nn::Scope& scope, int i, const Tensor& x,
                          const Tensor& documents) const {
  const auto& c = config_;
  const Layout l = layout_of(c, scope);
  const double out_scale =
      1.0 / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(c.num_layers, 1)));
  const parallel::TPTransformerBlock block{.num_heads = c.num_heads,
                                           .causal = c.causal,
                                           .mlp_hidden = c.mlp_ratio * c.d_model,
                                           .dropout = c.dropout,
                                           .ln_eps = c.ln_eps,
                                           .remat = c.remat,
                                           .remat_attn = c.remat_attn,
                                           .remat_mlp = c.remat_mlp,
                                           .kernel_init = nn::lecun_normal(),
                                           .out_init = nn::scaled(nn::lecun_normal(), out_scale),
                                           .axis = c.tp.axis,
                                           .layout = c.tp.layout,
                                           .sequence_parallel = l.sp,
                                           .bidirectional = c.tp.bidirectional,
                                           .parallel = c.parallel_block,
                                           .segments = c.document_attention ? documents
                                                                            : Tensor(),
                                           .context = context_split(c, scope) ? c.cp
                                                                           : parallel::ContextPlan{},
                                           .moe = c.moe_block(i) ? std::optional<nn::MoE>(moe_of(c))
                                                                 : std::nullopt};
  return block(scope.child("blocks").child(i).module("Block"), x);
}

Tensor Transformer::head(const nn::Scope& scope, const Tensor& x_in) const {
  const auto& c = config_;
  const TransformerTP& tp = c.tp;
  const Layout l = layout_of(c, scope);
  spmd::DeviceContext* ctx = scope.context();
  Tensor x = x_in;
  const nn::Embedding wte{.num_embeddings = c.vocab,
                          .features = c.d_model,
                          .embedding_init = nn::normal(0.02),
                          .embedding_spec = l.table_spec};
  if (l.feature_sharded) {
    // Norm over the sharded features, then partial logits from this device's columns,
    // summed over the axis: (B, T, V) replicated.
    x = parallel::TPNorm{.kind = parallel::TPNorm::Kind::Layer, .eps = c.ln_eps, .axis = tp.axis}(
        scope.child("ln_f"), x);
    Tensor partial = c.tied_embeddings
                         ? wte.attend(scope.child("wte"), x)
                         : parallel::TPDense{.features = c.vocab,
                                             .axis = tp.axis,
                                             .mode = parallel::TPMode::Scatter,
                                             .skip_communication = true,
                                             .use_bias = false}(scope.child("lm_head"), x);
    return parallel::reduce_from_tp_region(ctx, partial, l.axis);
  }
  x = nn::LayerNorm{.eps = c.ln_eps}(scope.child("ln_f"), x);
  if (c.num_classes > 0) {
    // The mean over every position, then the classes: (B, K), replicated.
    if (l.sp && l.n > 1) x = spmd::all_gather_invariant(*ctx, x, l.axis, 1, /*tiled=*/true);
    return nn::Dense{.features = c.num_classes}(scope.child("classifier"), tensor::mean(x, {1}));
  }
  if (l.vocab_parallel) {
    // The head's logits stay split over the vocabulary: (B, T, V/n).
    if (l.sp) x = parallel::gather_from_sp_region(ctx, x, l.axis, 1);
    const parallel::VocabParallelEmbedding wte_vp{
        .num_embeddings = c.vocab, .features = c.d_model, .axis = tp.axis};
    if (c.tied_embeddings) return wte_vp.attend(scope.child("wte"), x);
    return parallel::ColumnParallelDense{.features = c.vocab, .axis = tp.axis, .use_bias = false}(
        scope.child("lm_head"), x);
  }
  if (l.sp && l.n > 1) x = spmd::all_gather_invariant(*ctx, x, l.axis, 1, /*tiled=*/true);
  if (c.tied_embeddings) return wte.attend(scope.child("wte"), x);  // (B, T, V)
  return nn::Dense{.features = c.vocab, .use_bias = false}(scope.child("lm_head"), x);
}

Shape Transformer::residual_shape(const nn::Scope& scope, std::int64_t batch,
                                  std::int64_t seq_len) const {
  const Layout l = layout_of(config_, scope);
  if (l.feature_sharded) return {batch, seq_len, config_.d_model / l.n};
  if (l.sp) return {batch, seq_len / l.n, config_.d_model};
  return {batch, seq_len, config_.d_model};
}

Tensor Transformer::loss_of_logits(const nn::Scope& scope, const Tensor& logits,
                                   const Tensor& targets, const Tensor& documents) const {
  const Counted counted = counted_rows(documents, logits, targets);
  const bool vocab_parallel =
      config_.tp.layout == parallel::TPLayout::Megatron && config_.tp.vocab_parallel;
  const Tensor loss =
      vocab_parallel
          ? tensor::mean(parallel::vocab_parallel_cross_entropy(
                scope.context(), counted.x, counted.targets, mesh::Axes(config_.tp.axis)))
          : tensor::mean(tensor::cross_entropy(counted.x, counted.targets));
  return counted.scale == 1.0 ? loss : loss * counted.scale;
}

Tensor Transformer::loss(const nn::Scope& scope, const Tensor& tokens, const Tensor& targets,
                         const Tensor& documents) const {
  // The MoE layers' balancing losses join the objective in the backward pass
  // (autodiff::add_loss); their statistics go to a scope that sows.
  return cross_entropy_loss(scope, tokens, targets, documents);
}

Tensor Transformer::cross_entropy_loss(const nn::Scope& scope, const Tensor& tokens,
                                       const Tensor& targets, const Tensor& documents) const {
  const auto& c = config_;
  const Layout l = layout_of(c, scope);
  // The replicated head tied to the embedding: ln_f, then the head's products and their mean
  // cross-entropy in chunks (tensor::linear_cross_entropy_mean), so the (B, T, V) logits
  // and their gradient never exist whole: the largest tensors of a language model's step.
  // The same loss and gradients as loss_of_logits(operator()), summed in another order.
  // A packed batch's ignored positions are dropped before the loss.
  if (l.feature_sharded || l.vocab_parallel || (l.sp && l.n > 1) || !c.tied_embeddings ||
      c.num_classes > 0)
    return loss_of_logits(scope, (*this)(scope, tokens, documents), targets, documents);
  Tensor x = embed(scope, tokens);
  for (std::int64_t i = 0; i < c.num_layers; ++i)
    x = block(scope, static_cast<int>(i), x, documents);
  const Counted counted = counted_rows(documents, x, targets);
  x = counted.x;
  const Tensor& labels = counted.targets;
  x = nn::LayerNorm{.eps = c.ln_eps, .to_compute = true}(scope.child("ln_f"), x);
  const nn::Embedding wte{.num_embeddings = c.vocab,
                          .features = c.d_model,
                          .embedding_init = nn::normal(0.02),
                          .embedding_spec = l.table_spec};
  const nn::Precision& p = scope.precision();
  const Tensor loss = tensor::linear_cross_entropy_mean(
      p.cast_to_compute(x), p.cast_to_compute(wte.table(scope.child("wte"))), labels,
      /*trans_w=*/true);
  return counted.scale == 1.0 ? loss : loss * counted.scale;
}

TensorTree Transformer::init(Key key) const {
  return init(key, nullptr);
}

TensorTree Transformer::init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                             const nn::FullySharded* fsdp) const {
  return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& scope) {
    (*this)(scope, example_input(1, init_seq_len(ctx)));
  });
}

std::int64_t Transformer::init_seq_len(const spmd::DeviceContext* ctx) const {
  // A sequence-parallel init needs T divisible by the model axis: one token per device;
  // a balanced context split cuts the sequence into two chunks per device.
  const int n = config_.tp.layout == parallel::TPLayout::None || ctx == nullptr
                    ? 1
                    : ctx->axis_size(mesh::Axes(config_.tp.axis));
  const int chunks = config_.cp.active() && config_.cp.layout.balanced ? 2 : 1;
  return std::min<std::int64_t>(n * chunks, config_.max_len);
}

Tensor Transformer::example_input(std::int64_t batch, std::int64_t seq_len) const {
  if (config_.input_features > 0) return Tensor::zeros({batch, seq_len, config_.input_features});
  return Tensor::zeros({batch, seq_len}, DType::I32);
}

Tensor Transformer::apply(const TensorTree& params, const Tensor& tokens, bool train,
                          Key dropout_key) const {
  return (*this)(nn::Scope::apply(&params, train, dropout_key), tokens);
}

std::int64_t Transformer::num_params() const {
  const auto& c = config_;
  const std::int64_t d = c.d_model, h = c.mlp_ratio * c.d_model;
  const std::int64_t mlp = d * h + h + h * d + d;
  const std::int64_t per_block = (c.parallel_block ? 1 : 2) * 2 * d  // ln1 (, ln2)
                                 + d * 3 * d + 3 * d                 // qkv
                                 + d * d + d                         // out
                                 + mlp;
  const std::int64_t moe_extra = c.moe_layers() * (moe_of(c).num_params(d) - mlp);
  const std::int64_t in = c.input_features > 0 ? c.input_features * d + d : c.vocab * d;
  const std::int64_t out = c.num_classes > 0   ? d * c.num_classes + c.num_classes
                           : c.tied_embeddings ? 0
                                               : d * c.vocab;
  return in + (c.learned_positions ? c.max_len * d : 0) + c.num_layers * per_block + moe_extra +
         2 * d + out;
}

std::int64_t Transformer::num_matmul_params() const {
  const auto& c = config_;
  std::int64_t n = num_params();
  if (c.learned_positions) n -= c.max_len * c.d_model;
  if (!c.tied_embeddings && c.input_features == 0)
    n -= c.vocab * c.d_model;  // the input lookup; the head stays
  // Of an MoE layer a token multiplies by the router, its top_k experts and the shared MLP.
  const nn::MoE moe = moe_of(c);
  n -= c.moe_layers() * (moe.num_params(c.d_model) - moe.active_params(c.d_model));
  return n;
}

double Transformer::flops_per_token(std::int64_t seq_len) const {
  const auto& c = config_;
  return 6.0 * static_cast<double>(num_matmul_params()) + 12.0 * static_cast<double>(c.num_layers) *
                                                              static_cast<double>(c.d_model) *
                                                              static_cast<double>(seq_len);
}

std::string moe_load_metric(const std::string& bias_path, std::int64_t g) {
  return "_load:" + bias_path + ":" + std::to_string(g);
}

void add_moe_metrics(const nn::Sown& sown, train::Metrics& metrics) {
  for (const auto& [name, values] : sown.metrics)
    for (const Tensor& v : values) metrics.add(name, v, 1.0, 1.0);
  for (const auto& [path, load] : sown.loads)
    for (std::size_t g = 0; g < load.size(); ++g)
      metrics.add(moe_load_metric(path, std::int64_t(g)), load[g], 1.0);
}

namespace {
std::string bias_path(std::int64_t layer) {
  return "blocks/" + std::to_string(layer) + "/moe/router/bias";
}
}  // namespace

std::vector<std::string> moe_metric_names(const TransformerConfig& c) {
  if (c.moe_layers() == 0) return {};
  std::vector<std::string> out = {"aux_loss", "z_loss", "expert_load_max_over_mean",
                                  "dropped_fraction"};
  if (c.moe.balance_bias_rate > 0)
    for (std::int64_t i = 0; i < c.num_layers; ++i)
      if (c.moe_block(i))
        for (std::int64_t g = 0; g < c.moe.num_experts; ++g)
          out.push_back(moe_load_metric(bias_path(i), g));
  return out;
}

void moe_balance_biases(const TransformerConfig& c, tensor::TensorTree& params,
                        const train::Metrics& step) {
  std::map<std::string, std::vector<double>> loads;
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    if (!c.moe_block(i) || !params.contains(bias_path(i))) continue;
    std::vector<double>& load = loads[bias_path(i)];
    for (std::int64_t g = 0; g < c.moe.num_experts; ++g) {
      const std::string name = moe_load_metric(bias_path(i), g);
      load.push_back(step.contains(name) ? step.at(name).sum : 0.0);
    }
  }
  nn::balance_bias_update(params, loads, c.moe.balance_bias_rate);
}

}  // namespace distjax::models
