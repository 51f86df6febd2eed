#include "distjax/plan/detail/stage_memory.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "distjax/core/error.hpp"
#include "distjax/parallel/pipeline_schedule.hpp"

namespace distjax::plan::detail {

namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::int64_t tp_dim(const ParamInfo& p) {
  switch (p.split) {
    case TPSplit::Column:
    case TPSplit::VocabColumn:
      return static_cast<std::int64_t>(p.shape.size()) - 1;
    case TPSplit::Row:
      return p.shape.size() == 2 ? 0 : -1;
    case TPSplit::VocabRow:
      return 0;
    case TPSplit::None:
    case TPSplit::ExpertColumn:  // split by experts_tp_dim, with expert tensor parallelism
    case TPSplit::ExpertRow:
      return -1;
  }
  return -1;
}

/// The chunk (of p v) that uses `p`.
int chunk_of(const ParamInfo& p, const ModelDescription& m, const Setup& s) {
  const int chunks = s.pipe * s.virtual_stages;
  if (p.layer >= 0) return static_cast<int>(p.layer / (m.layers / chunks));
  if (starts_with(p.path, "ln_f") || starts_with(p.path, "lm_head")) return chunks - 1;
  return 0;  // the embeddings
}

bool vocab_parallel(const ModelDescription& m, const Setup& s) {
  return s.tensor > 1 && std::any_of(m.params.begin(), m.params.end(), [](const ParamInfo& p) {
           return p.split == TPSplit::VocabRow;
         });
}

/// One part of a chunk's forward for one micro-batch, as its backward meets them: the
/// head, the blocks from the top, the chunk's input (the embedding on chunk 0).
struct Unit {
  double saved = 0;      // kept from the forward to the backward
  double grads = 0;      // gradient bytes its backward leaves (fresh tensors)
  double transient = 0;  // exists only while its backward runs
};

/// Bytes of activations one transformer layer keeps for `tokens` tokens of one micro-batch.
double layer_bytes(const ModelDescription& m, const Setup& s, double tokens, Recompute r) {
  const ActivationModel& a = s.activations;
  const double h = double(m.d_model), t = s.tensor, seq = double(s.seq_len);
  const bool sp = s.sequence_parallel && s.tensor > 1;
  if (r == Recompute::Full) return tokens * h * a.layer_full_remat / (sp ? t : 1);
  if (r == Recompute::Selective && a.layer_selective > 0) return tokens * h * a.layer_selective / t;
  const double per_h = s.tensor == 1 ? a.layer_unsplit
                       : sp          ? a.layer_replicated_sp + a.layer_split_sp / t
                                     : a.layer_replicated + a.layer_split / t;
  return tokens * (h * per_h + (s.tensor > 1 ? a.layer_per_token : 0.0) +
                   double(m.heads) / t * (a.layer_per_head + a.layer_per_head_seq * seq) +
                   (s.context > 1 ? h / t *
                                        (s.context_ulysses ? a.layer_context_ulysses
                                                           : a.layer_context_ring)
                                  : 0.0));
}

/// Rows of an MoE layer's expert products per token of a device: on the device that routed
/// them (`src`: k kept pairs, fewer under a capacity factor below 1) and on the devices that
/// run them (`recv`: with an expert axis, what arrives, at capacity or, dropless, at
/// kDroplessPlanningFactor).
struct MoeRows {
  double src = 0, recv = 0;
};
MoeRows moe_rows(const MoEShape& moe, const Setup& s) {
  const double k = double(moe.top_k), cf = moe.capacity_factor;
  MoeRows r;
  r.src = cf < 0 ? k : k * std::min(1.0, cf);
  r.recv = s.expert == 1 ? r.src : k * (cf < 0 ? kDroplessPlanningFactor : cf);
  return r;
}

/// What an MoE layer keeps (saved) and its backward adds (transient) per token beyond the
/// dense layer's figure, whose MLP part (its two hidden tensors, 8 h per token, and their
/// cotangents) it replaces: the f32 router (logits, probabilities, log-probabilities), the
/// rows in the expert order and their outputs (2 h per pair), the experts' 2 hidden tensors
/// (4 with SwiGLU), with an expert axis the rows received and their outputs, a shared MLP's
/// 2 hidden tensors; in backward the hidden and row cotangents, and with an expert axis the
/// exchange's padded buffers both ways. Conservative: the runs measured (docs/plan.md)
/// peak below it.
struct MoeLayerBytes {
  double saved = 0, transient = 0;
};
MoeLayerBytes moe_layer_bytes(const ModelDescription& m, const Setup& s, double tokens) {
  const ActivationModel& a = s.activations;
  const MoEShape& moe = m.moe;
  const double h = double(m.d_model), act = s.activation_bytes, t = s.tensor;
  const bool sp = s.sequence_parallel && s.tensor > 1;
  const double split = s.tensor > 1 ? t : 1.0;  // the dense MLP's hidden split by t
  const double dense_saved = tokens * 8.0 * h * act / split;
  const double dense_transient =
      tokens * h * (s.tensor > 1 ? a.layer_backward_split / t : a.layer_backward_unsplit);
  // The experts run on every token of the layer's input: all of them along "model", or the
  // device's sequence share with sequence parallelism (all of them again when the experts
  // are split over "model": the layer gathers the sequence first).
  const double n = sp && !moe.tensor_parallel ? tokens / t : tokens;
  // A shared MLP's hidden width here: split over "model" with the experts.
  const double shared = double(moe.shared_hidden) / (moe.tensor_parallel ? t : 1.0);
  const MoeRows r = moe_rows(moe, s);
  // Each expert's hidden width: its slice on this device with expert tensor parallelism.
  const double width = double(moe.hidden) / (moe.tensor_parallel ? t : 1.0);
  const double hidden = width * (moe.swiglu ? 4.0 : 2.0);
  MoeLayerBytes b;
  // Kept: the routed rows' outputs (for the gates' gradient) and, where the experts run,
  // their input rows, hidden tensors and (with an expert axis, before the exchange back)
  // outputs; on one device the input rows are the routed rows themselves.
  const double rows_kept = s.expert > 1 ? h * r.src + 2.0 * h * r.recv : 2.0 * h * r.src;
  b.saved =
      n * (4.0 * 3.0 * double(moe.experts) + act * (rows_kept + r.recv * hidden + 2.0 * shared)) -
      dense_saved;
  b.transient = n * act *
                    (r.recv * (2.0 * width + 2.0 * h) + (s.expert > 1 ? 2.0 * r.recv * h : 0.0) +
                     2.0 * shared) -
                dense_transient;
  return b;
}

/// V': the vocabulary a device's logits cover (split by t in Megatron's calibration).
double vocab_share(const ModelDescription& m, const Setup& s) {
  return s.activations.name == "megatron-16bit" ? double(m.vocab) / s.tensor : double(m.vocab);
}

double head_bytes(const ModelDescription& m, const Setup& s, double tokens) {
  const ActivationModel& a = s.activations;
  return tokens * (vocab_share(m, s) * a.head_per_vocab +
                   double(m.d_model) * (a.head_replicated + a.head_split / s.tensor));
}

/// The units of chunk `chunk` (of p v) for one micro-batch of `tokens` tokens, top down.
std::vector<Unit> chunk_units(const ModelDescription& m, const Setup& s,
                              const std::vector<LocalLeaf>& leaves, int chunk, double tokens) {
  const ActivationModel& a = s.activations;
  const int last = s.pipe * s.virtual_stages - 1;
  const bool sp = s.sequence_parallel && s.tensor > 1;
  const double h = double(m.d_model), split = sp ? double(s.tensor) : 1.0;
  const double x = tokens * h * s.activation_bytes / split;  // one residual (b, s, h)
  const bool remat = s.recompute == Recompute::Full ||
                     (s.recompute == Recompute::Selective && a.layer_selective > 0);
  // A head tied to the embedding (one chunk holding both) meets the table first: its
  // gradient comes from the head's matmul, and the lookup's is added into it at the bottom.
  const bool tied_head = chunk == last && chunk == 0 &&
                         std::none_of(leaves.begin(), leaves.end(), [](const LocalLeaf& l) {
                           return starts_with(l.param->path, "lm_head");
                         });
  Unit head, input;
  std::map<int, Unit, std::greater<>> blocks;  // from the top
  for (const LocalLeaf& l : leaves) {
    if (l.chunk != chunk) continue;
    const ParamInfo& p = *l.param;
    const bool table = starts_with(p.path, "wte");
    Unit& u = p.layer >= 0                                          ? blocks[p.layer]
              : (table && !tied_head) || starts_with(p.path, "wpe") ? input
                                                                    : head;
    if (a.step_gradients) u.grads += double(l.elems) * s.grad_bytes;
    if (a.step_gradients && table && tied_head) input.transient += double(l.elems) * s.grad_bytes;
    if (l.gathered == 0) continue;
    // FSDP: the whole gradient before its reduce-scatter; the gathered weight, kept by the
    // ops that use it, or gathered again in backward under full recomputation.
    u.transient += double(l.gathered) * s.grad_bytes;
    if (p.layer >= 0 && s.recompute == Recompute::Full) {
      u.transient += double(l.gathered) * s.param_bytes;
    } else {
      u.saved += double(l.gathered) * s.param_bytes;
    }
  }
  std::vector<Unit> out;
  if (chunk == last) {
    head.saved += head_bytes(m, s, tokens);
    // The logits' cotangent and the one cotangent it sends down.
    head.transient +=
        tokens * vocab_share(m, s) * a.head_backward_per_vocab + a.cotangent_buffers / 2 * x;
    out.push_back(head);
  }
  for (auto& [layer, b] : blocks) {
    b.saved += layer_bytes(m, s, tokens, s.recompute);
    b.transient +=
        a.cotangent_buffers * x +
        tokens * h * (s.tensor > 1 ? a.layer_backward_split / s.tensor : a.layer_backward_unsplit);
    if (remat) b.transient += layer_bytes(m, s, tokens, Recompute::None);  // rebuilt
    if (m.moe.is_moe_layer(layer)) {
      const MoeLayerBytes moe = moe_layer_bytes(m, s, tokens);
      b.saved += moe.saved;
      b.transient += moe.transient;
    }
    out.push_back(b);
  }
  input.saved += tokens * h * a.stage_input / split;
  if (chunk == 0) {
    input.saved += tokens * h *
                   ((sp ? a.embed_sequence_parallel : 0.0) +
                    (vocab_parallel(m, s) ? a.embed_vocab_parallel : 0.0));
    input.transient += a.cotangent_buffers / 2 * x;  // the one cotangent it receives
  }
  if (s.pipe > 1) input.saved += tokens * a.microbatch_per_token;
  out.push_back(input);
  return out;
}

double saved_of(const std::vector<Unit>& units) {
  double b = 0;
  for (const Unit& u : units)
    b += u.saved;
  return b;
}

double grads_of(const std::vector<Unit>& units) {
  double b = 0;
  for (const Unit& u : units)
    b += u.grads;
  return b;
}

/// The most bytes a chunk's backward holds beyond what was alive before it. Its units are
/// met top down, each one's gradients complete before its saved activations are freed;
/// `after_first` appears once the first unit is done (data parallelism's buckets, opened by
/// the first final gradient); at the end every gradient is there and only the chunk's
/// input is still held, with `at_end` (a pipeline's first copy into its accumulator,
/// ZeRO-2's scatter). Without `with_grads` (the zero-bubble input part) the weight
/// gradients wait for W, the activations too.
double backward_peak(const std::vector<Unit>& units, bool with_grads, double after_first,
                     double at_end) {
  double grads = 0, freed = 0, peak = 0, opened = 0;
  for (const Unit& u : units) {
    if (with_grads) grads += u.grads;
    peak = std::max(peak, grads - freed + opened + u.transient);
    if (with_grads) freed += u.saved;
    opened = after_first;
  }
  if (!with_grads) return peak;
  return std::max(peak, grads - freed + opened + units.back().saved + at_end);
}

parallel::ScheduleKind schedule_kind(PipeSchedule k) {
  switch (k) {
    case PipeSchedule::GPipe:
      return parallel::ScheduleKind::GPipe;
    case PipeSchedule::OneFOneB:
      return parallel::ScheduleKind::OneFOneB;
    case PipeSchedule::Interleaved:
      return parallel::ScheduleKind::Interleaved1F1B;
    case PipeSchedule::ZeroBubble:
      return parallel::ScheduleKind::ZeroBubbleH1;
    case PipeSchedule::InterleavedZeroBubble:
      return parallel::ScheduleKind::InterleavedZeroBubble;
  }
  return parallel::ScheduleKind::OneFOneB;
}

/// One stage of a pipeline: its actions in order, each forward adding a micro-batch
/// chunk's saved activations, each backward its peak and then freeing them; the gradient
/// accumulator appears at a chunk's first backward, the posted receives from the start.
double pipeline_stage_peak(const ModelDescription& m, const Setup& s, int stage,
                           const std::vector<LocalLeaf>& leaves, double tokens) {
  const parallel::PipelineSchedule schedule = parallel::make_schedule(
      schedule_kind(s.schedule), s.pipe, static_cast<int>(s.microbatches), s.virtual_stages);
  const int last = schedule.num_chunks() - 1;
  std::map<int, std::vector<Unit>> units;
  bool receives_activations = false, receives_grads = false;
  for (int c : schedule.chunks_of(stage)) {
    units[c] = chunk_units(m, s, leaves, c, tokens);
    receives_activations |= c > 0;
    receives_grads |= c < last;
  }
  const double x = tokens * double(m.d_model) * s.activation_bytes /
                   (s.sequence_parallel && s.tensor > 1 ? s.tensor : 1);
  double live =
      s.activations.receive_buffers * (int(receives_activations) + int(receives_grads)) * x;
  double peak = live;
  std::set<int> accumulated;  // chunks whose gradients have an accumulator already
  for (const parallel::PipelineAction& a : schedule.actions[static_cast<std::size_t>(stage)]) {
    // Transfers: their buffers are the receives counted above.
    if (a.op != parallel::PipelineOp::Forward && a.op != parallel::PipelineOp::Backward &&
        a.op != parallel::PipelineOp::BackwardInput && a.op != parallel::PipelineOp::BackwardWeight)
      continue;
    const std::vector<Unit>& u = units.at(a.chunk);
    const double grads = grads_of(u);
    const double first_copy = accumulated.count(a.chunk) != 0 ? 0.0 : grads;
    switch (a.op) {
      case parallel::PipelineOp::Forward:
        live += saved_of(u);
        peak = std::max(peak, live);
        break;
      case parallel::PipelineOp::Backward:
        peak = std::max(peak, live + backward_peak(u, true, 0.0, first_copy));
        live += first_copy - saved_of(u);
        accumulated.insert(a.chunk);
        break;
      case parallel::PipelineOp::BackwardInput:  // the activations stay until W
        peak = std::max(peak, live + backward_peak(u, false, 0.0, 0.0));
        break;
      case parallel::PipelineOp::BackwardWeight:
        peak = std::max(peak, live + grads + first_copy);
        live += first_copy - saved_of(u);
        accumulated.insert(a.chunk);
        break;
      default:
        break;
    }
  }
  return peak;
}

}  // namespace

std::vector<LocalLeaf> stage_leaves(const ModelDescription& m, const Setup& s, int stage) {
  std::vector<LocalLeaf> out;
  for (const ParamInfo& p : m.params) {
    const int chunk = s.pipe > 1 ? chunk_of(p, m, s) : 0;
    if (chunk % s.pipe != stage) continue;
    std::vector<std::int64_t> shape = p.shape;
    const std::int64_t d = tp_dim(p);
    if (is_expert(p.split) && s.expert > 1) {
      DISTJAX_CHECK(shape[0] % s.expert == 0, InvalidArgument, "[plan] the ", shape[0],
                    " experts of \"", p.path, "\" do not split over expert = ", s.expert);
      shape[0] /= s.expert;
    }
    if (is_expert(p.split) && m.moe.tensor_parallel && s.tensor > 1) {
      const std::size_t hd = p.split == TPSplit::ExpertColumn ? 2 : 1;
      DISTJAX_CHECK(shape[hd] % s.tensor == 0, InvalidArgument, "[plan] the experts' hidden width ",
                    shape[hd], " of \"", p.path, "\" does not split over model = ", s.tensor);
      shape[hd] /= s.tensor;
    }
    if (d >= 0 && s.tensor > 1 &&
        (p.split == TPSplit::VocabRow || p.split == TPSplit::VocabColumn)) {
      shape[d] = (shape[d] + s.tensor - 1) / s.tensor;  // padded vocabulary, as Megatron's
    } else if (d >= 0 && s.tensor > 1) {
      DISTJAX_CHECK(shape[d] % s.tensor == 0, InvalidArgument, "[plan] parameter \"", p.path,
                    "\" dimension ", d, " of size ", shape[d],
                    " does not split over model = ", s.tensor);
      shape[d] /= s.tensor;
    }
    LocalLeaf leaf;
    leaf.param = &p;
    leaf.chunk = chunk;
    leaf.elems = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    // mesh::fully_sharded_spec: global size >= min_weight_size and a dimension divisible,
    // over the "data" axis (the devices that see different examples but the expert axis).
    const int shards = s.data / s.expert;
    if (s.fsdp && shards > 1 && p.numel() >= s.fsdp_min_weight_size &&
        std::any_of(shape.begin(), shape.end(), [&](std::int64_t e) { return e % shards == 0; })) {
      leaf.gathered = leaf.elems;
      leaf.elems /= shards;
    }
    out.push_back(leaf);
  }
  return out;
}

double gpt_activation_peak(const ModelDescription& m, const Setup& s, int stage,
                           const std::vector<LocalLeaf>& leaves) {
  const double micro = s.pipe > 1 ? double(s.microbatches) : 1.0;
  const double tokens =
      double(s.global_batch) / s.data / micro * double(s.seq_len) / double(s.context);
  if (s.pipe > 1) return pipeline_stage_peak(m, s, stage, leaves, tokens);
  // One stage, one pass: the saved activations, then the backward, with data parallelism's
  // buckets (a copy of the replicated gradients) from its first final gradient on, or
  // ZeRO-2's copy and kept chunk of the gradients at its end.
  const std::vector<Unit> units = chunk_units(m, s, leaves, 0, tokens);
  // The devices that average the gradients: the experts' over data / expert only (the
  // replicas holding the same experts).
  const int averaged = s.data * s.context;
  const int experts_averaged = s.data / s.expert * s.context;
  double replicated = 0, kept = 0;  // kept: ZeRO-2's chunks of them
  for (const LocalLeaf& l : leaves) {
    const int over = is_expert(l.param->split) ? experts_averaged : averaged;
    if (l.gathered == 0 && over > 1) {
      replicated += double(l.elems) * s.grad_bytes;
      kept += double(l.elems) * s.grad_bytes / over;
    }
  }
  const bool copies = s.activations.gradient_bucket_copy && averaged > 1;
  const double bucket = copies && s.zero_stage == 0 ? replicated : 0.0;
  const double scatter = copies && s.zero_stage == 2 ? replicated + kept : 0.0;
  return saved_of(units) + backward_peak(units, true, bucket, scatter);
}

}  // namespace distjax::plan::detail
