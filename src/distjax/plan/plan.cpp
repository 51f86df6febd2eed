#include "distjax/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>

#include "distjax/core/error.hpp"
#include "distjax/plan/detail/stage_memory.hpp"

namespace distjax::plan {

std::int64_t ParamInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

std::int64_t ModelDescription::moe_layers() const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < layers; ++i) n += moe.is_moe_layer(i) ? 1 : 0;
  return n;
}

std::int64_t ModelDescription::num_params() const {
  std::int64_t n = 0;
  for (const ParamInfo& p : params)
    n += p.numel();
  return n;
}

ActivationModel activation_model_megatron() {
  ActivationModel m;
  m.name = "megatron-16bit";
  m.layer_unsplit = 34;      // 34 s b h without tensor parallelism
  m.layer_replicated = 10;   // layer norms' inputs, dropout masks, residual: 10 s b h
  m.layer_split = 24;        // QKV, attention output, MLP activations: 24 s b h / t
  m.layer_split_sp = 34;     // sequence parallel: all of it split, 34 s b h / t
  m.layer_per_head_seq = 5;  // softmax output, its dropout mask, scores: 5 a s^2 b / t
  m.head_per_vocab = 4;      // f32 logits of the vocabulary-parallel cross-entropy / t
  m.head_replicated = 4;     // final norm input and output
  m.layer_full_remat = 2;    // the block input, 16-bit
  m.layer_selective = 34;    // 34 s b h / t
  return m;
}

ActivationModel activation_model_distjax() {
  ActivationModel m;
  m.name = "distjax-f32";
  m.layer_unsplit = 64;        // 16 f32 tensors of (b, s, h) per block
  m.layer_replicated = 40;     // Megatron layout: 10 of them kept whole along "model",
  m.layer_split = 48;          //   12 split by t (QKV, attention output, MLP hidden)
  m.layer_replicated_sp = 16;  // sequence parallel: 4 of them still whole,
  m.layer_split_sp = 72;       //   18 split along the sequence
  m.layer_per_token = 12;      // the Megatron layout's norm statistics
  m.layer_per_head = 8;        // the fused attention's max and sum per (head, row)
  m.head_per_vocab = 4;        // logits (b, s, V) f32, and in backward their cotangent
  m.head_backward_per_vocab = 4;
  m.head_replicated = 4;           // the final norm's output (split by t: the gathered one
  m.head_split = 4;                //   of sequence parallelism)
  m.layer_full_remat = 4;          // the block input
  m.layer_selective = -1;          // not implemented: selective recompute plans as none
  m.stage_input = 4;               // (b, s, h) f32
  m.embed_sequence_parallel = 12;  // the lookup's output before it is split, its gather
  m.embed_vocab_parallel = 12;     // the masked lookup and its partial sums
  m.microbatch_per_token = 16;     // i32 ids and labels, sliced and marked per micro-batch
  m.cotangent_buffers = 2;
  m.layer_backward_unsplit = 32;  // the MLP's hidden cotangents, (b, s, 4h) f32 twice, while
  m.layer_backward_split = 8;     //   its saved ones live; split by t: 2 h / t measured
  m.receive_buffers = 2;          // parallel::Pipeline's kReceiveLookahead
  // Across a context split (measured on configs/gpt_long.toml, T = 8192, cp = 2, 4, 8): the
  // ring's q, k, v copies and merged output fit within the layer's own figure (which over-
  // counts this shape by 4-10%); Ulysses keeps 6 f32 tensors of (b, s / cp, h) more (the
  // gathered sequence of its heads, put in order, and its output on the way back).
  m.layer_context_ring = 0;
  m.layer_context_ulysses = 24;
  m.gradient_bucket_copy = true;
  m.step_gradients = true;
  return m;
}

ModelDescription describe_gpt(std::int64_t vocab, std::int64_t d_model, std::int64_t layers,
                              std::int64_t heads, std::int64_t max_len, bool vocab_parallel,
                              bool tied, const MoEShape& moe) {
  const std::int64_t c = d_model;
  ModelDescription m;
  m.name = moe.experts > 0 ? "gpt (MoE)" : "gpt";
  m.vocab = vocab;
  m.d_model = c;
  m.layers = layers;
  m.heads = heads;
  m.moe = moe;
  auto add = [&](std::string path, std::vector<std::int64_t> shape, TPSplit split, int layer) {
    m.params.push_back({std::move(path), std::move(shape), split, layer});
  };
  add("wte/embedding", {vocab, c}, vocab_parallel ? TPSplit::VocabRow : TPSplit::None, -1);
  add("wpe/embedding", {max_len, c}, TPSplit::None, -1);
  for (int i = 0; i < layers; ++i) {
    const std::string b = "blocks/" + std::to_string(i) + "/";
    add(b + "ln1/scale", {c}, TPSplit::None, i);
    add(b + "ln1/bias", {c}, TPSplit::None, i);
    add(b + "attn/qkv/kernel", {c, 3 * c}, TPSplit::Column, i);
    add(b + "attn/qkv/bias", {3 * c}, TPSplit::Column, i);
    add(b + "attn/out/kernel", {c, c}, TPSplit::Row, i);
    add(b + "attn/out/bias", {c}, TPSplit::None, i);
    add(b + "ln2/scale", {c}, TPSplit::None, i);
    add(b + "ln2/bias", {c}, TPSplit::None, i);
    if (!moe.is_moe_layer(i)) {
      add(b + "mlp/fc1/kernel", {c, 4 * c}, TPSplit::Column, i);
      add(b + "mlp/fc1/bias", {4 * c}, TPSplit::Column, i);
      add(b + "mlp/fc2/kernel", {4 * c, c}, TPSplit::Row, i);
      add(b + "mlp/fc2/bias", {c}, TPSplit::None, i);
      continue;
    }
    // An MoE layer: its router whole along "model", its experts split over "expert" (and
    // their hidden width over "model" with expert tensor parallelism), as nn::MoE holds them
    // in the megatron layout.
    const std::int64_t e = moe.experts, h = moe.hidden;
    add(b + "moe/router/kernel", {c, e}, TPSplit::None, i);
    if (moe.bias) add(b + "moe/router/bias", {e}, TPSplit::None, i);
    add(b + "moe/experts/fc1", {e, c, h}, TPSplit::ExpertColumn, i);
    if (moe.swiglu) add(b + "moe/experts/gate", {e, c, h}, TPSplit::ExpertColumn, i);
    add(b + "moe/experts/fc2", {e, h, c}, TPSplit::ExpertRow, i);
    if (moe.shared_hidden > 0) {
      // Split over "model" as a dense MLP beside the experts' slices, else whole.
      const TPSplit cols = moe.tensor_parallel ? TPSplit::Column : TPSplit::None;
      const TPSplit rows = moe.tensor_parallel ? TPSplit::Row : TPSplit::None;
      add(b + "moe/shared/fc1/kernel", {c, moe.shared_hidden}, cols, i);
      add(b + "moe/shared/fc1/bias", {moe.shared_hidden}, cols, i);
      add(b + "moe/shared/fc2/kernel", {moe.shared_hidden, c}, rows, i);
      add(b + "moe/shared/fc2/bias", {c}, TPSplit::None, i);
    }
  }
  add("ln_f/scale", {c}, TPSplit::None, -1);
  add("ln_f/bias", {c}, TPSplit::None, -1);
  if (!tied)
    add("lm_head/kernel", {c, vocab}, vocab_parallel ? TPSplit::VocabColumn : TPSplit::None, -1);
  return m;
}

ModelDescription describe_classifier(std::int64_t in_features, std::int64_t hidden,
                                     std::int64_t num_classes) {
  ModelDescription m;
  m.name = "classifier";
  m.in_features = in_features;
  m.hidden = hidden;
  m.num_classes = num_classes;
  m.params = {{"fc1/kernel", {in_features, hidden}, TPSplit::None, -1},
              {"fc1/bias", {hidden}, TPSplit::None, -1},
              {"fc2/kernel", {hidden, num_classes}, TPSplit::None, -1},
              {"fc2/bias", {num_classes}, TPSplit::None, -1}};
  return m;
}

namespace {

double ring_all_reduce(int n, double bytes) {
  return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}
double ring_gather(int n, double bytes) {
  return n > 1 ? double(n - 1) / n * bytes : 0.0;
}

}  // namespace

double Plan::comm_bytes() const {
  double b = 0;
  for (const CommEntry& e : comm)
    b += e.bytes;
  return b;
}

std::string describe_setup(const Setup& s) {
  std::string out = "data=" + std::to_string(s.data / s.expert);
  if (s.expert > 1) out += " expert=" + std::to_string(s.expert);
  out += " model=" + std::to_string(s.tensor) + " pipe=" + std::to_string(s.pipe);
  if (s.context > 1)
    out += " context=" + std::to_string(s.context) + (s.context_ulysses ? " (ulysses)" : "");
  if (s.fsdp) {
    out += " FSDP";
  } else if (s.zero_stage > 0) {
    out += " ZeRO-" + std::to_string(s.zero_stage);
  } else {
    out += " DP";
  }
  return out;
}

namespace {

void check_setup(const ModelDescription& m, const Setup& s) {
  DISTJAX_CHECK(s.data >= 1 && s.tensor >= 1 && s.pipe >= 1 && s.context >= 1 &&
                    s.virtual_stages >= 1,
                InvalidArgument, "[plan] mesh sizes and virtual stages must be positive, got ",
                describe_setup(s), ", virtual stages ", s.virtual_stages);
  DISTJAX_CHECK(s.global_batch % s.data == 0, InvalidArgument, "[plan] batch ", s.global_batch,
                " does not split over data = ", s.data);
  DISTJAX_CHECK(s.expert >= 1 && s.data % s.expert == 0, InvalidArgument, "[plan] expert = ",
                s.expert, " must divide the ", s.data, " devices that see different examples");
  DISTJAX_CHECK(s.expert == 1 || m.moe.experts > 0, InvalidArgument, "[plan] expert = ", s.expert,
                " splits the experts of MoE layers, but the model has none");
  DISTJAX_CHECK(m.moe.experts == 0 || m.moe.experts % s.expert == 0, InvalidArgument, "[plan] ",
                m.moe.experts, " experts do not split over expert = ", s.expert);

  const bool gpt = m.layers > 0;
  DISTJAX_CHECK(gpt || (s.tensor == 1 && s.pipe == 1 && s.context == 1), NotImplemented,
                "[plan] the classifier is planned on a (\"data\") mesh only, got ",
                describe_setup(s));
  if (!gpt) return;
  const std::int64_t chunks = std::int64_t{s.pipe} * (s.pipe > 1 ? s.virtual_stages : 1);
  DISTJAX_CHECK(m.layers % chunks == 0, InvalidArgument, "[plan] ", m.layers,
                " layers do not split over pipe = ", s.pipe,
                " x virtual stages = ", chunks / s.pipe);
  DISTJAX_CHECK(m.heads % s.tensor == 0, InvalidArgument, "[plan] ", m.heads,
                " heads do not split over model = ", s.tensor);
  DISTJAX_CHECK(s.seq_len % s.context == 0, InvalidArgument, "[plan] sequence ", s.seq_len,
                " does not split over context = ", s.context);
  DISTJAX_CHECK(!s.sequence_parallel || (s.seq_len / s.context) % s.tensor == 0, InvalidArgument,
                "[plan] sequence parallelism: sequence ", s.seq_len / s.context,
                " (per context device) does not split over model = ", s.tensor);
  DISTJAX_CHECK(!s.context_ulysses || (m.heads / s.tensor) % s.context == 0, InvalidArgument,
                "[plan] Ulysses: ", m.heads / s.tensor, " heads per device do not split over context = ",
                s.context);
  DISTJAX_CHECK(s.pipe == 1 || (s.global_batch / s.data) % s.microbatches == 0, InvalidArgument,
                "[plan] each replica's batch ", s.global_batch / s.data, " does not split into ",
                s.microbatches, " micro-batches");
}

/// What data parallelism adds to the gradients `grads` within the step's backward, when it
/// copies them (ActivationModel::gradient_bucket_copy): plain data parallelism its buckets,
/// ZeRO-2 the buffer it reduce-scatters and the chunk it keeps; ZeRO-1 nothing yet.
double step_copies(const Setup& s, double grads) {
  if (s.data == 1 || s.zero_stage == 1) return 0.0;
  return s.zero_stage == 2 ? grads + grads / s.data : grads;
}

/// The devices that average the gradients (data x context; the expert axis is part of
/// data) and the axes' label.
int averaged(const Setup& s) {
  return s.data * s.context;
}
std::string averaged_axes(const Setup& s) {
  return std::string(s.expert > 1 ? "data,expert" : "data") + (s.context > 1 ? ",context" : "");
}

/// The classifier's activation peak: the larger of the end of forward (fc1's output, silu's
/// output, the dropout mask and output, h each, the logits, K, f32; the data-parallel
/// bucket, allocated when backward starts) and the end of backward (the gradients and
/// what the strategy adds in the step: data parallelism's bucket copy, ZeRO-2's copy and
/// the chunks it keeps, FSDP's gathered weights and full gradients; the first layer's
/// input cotangent and the loss). ZeRO-1 reduce-scatters after the step's backward.
double classifier_activation_peak(const ModelDescription& m, const Setup& s,
                                  const std::vector<detail::LocalLeaf>& leaves) {
  double elems = 0, fsdp_full = 0;
  for (const detail::LocalLeaf& l : leaves) {
    elems += double(l.elems);
    fsdp_full += double(l.gathered);
  }
  const int d = s.data;
  const double b_local = double(s.global_batch) / d;
  const double grads = elems * s.grad_bytes;
  const bool copy = s.activations.gradient_bucket_copy;
  const double bucket = copy && d > 1 && !s.fsdp && s.zero_stage == 0 ? grads : 0.0;
  const double end_of_forward = b_local * 4.0 * double(4 * m.hidden + m.num_classes) + bucket;
  // (Without the bucket copy the gradients are the state's own, counted once, not here.)
  const double end_of_backward = (copy ? grads + step_copies(s, grads) : 0.0) +
                                 fsdp_full * (s.grad_bytes + s.param_bytes) +
                                 b_local * 4.0 * double(m.hidden) + 4.0;
  return std::max(end_of_forward, end_of_backward);
}

/// The state and activation peak of one device of pipeline stage `stage`.
Plan stage_plan(const ModelDescription& m, const Setup& s, int stage,
                const std::vector<detail::LocalLeaf>& leaves) {
  Plan plan;
  plan.setup = s;
  plan.stage = stage;
  plan.model_name = m.name;
  plan.model_params = m.num_params();
  double elems = 0, expert_elems = 0;
  for (const detail::LocalLeaf& l : leaves) {
    elems += double(l.elems);
    if (is_expert(l.param->split) && s.expert > 1) expert_elems += double(l.elems);
  }
  // ZeRO shards over the devices that average: the experts split over "expert" over the
  // replicas holding the same experts (data / expert x context), the rest over them all.
  const int d = averaged(s), de = s.data / s.expert * s.context;
  auto per_device = [&](double bytes_per_elem, bool sharded) {
    return sharded ? ((elems - expert_elems) / d + expert_elems / de) * bytes_per_elem
                   : elems * bytes_per_elem;
  };
  plan.params_per_device = elems;
  plan.parameters = elems * s.param_bytes;
  plan.gradients = per_device(s.grad_bytes, s.zero_stage >= 2);
  plan.optimizer_state =
      per_device(s.optimizer_slots * s.state_bytes + (s.master_weights ? 4 : 0), s.zero_stage >= 1);
  plan.activations = m.layers > 0 ? detail::gpt_activation_peak(m, s, stage, leaves)
                                  : classifier_activation_peak(m, s, leaves);
  return plan;
}

/// Communication per step of one device (ring figures, as comm::CommStats counts).
std::vector<CommEntry> stage_comm(const ModelDescription& m, const Setup& s,
                                  const std::vector<detail::LocalLeaf>& leaves) {
  std::vector<CommEntry> comm;
  double replicated_elems = 0, expert_elems = 0, fsdp_full = 0;
  for (const detail::LocalLeaf& l : leaves) {
    if (l.gathered > 0) {
      fsdp_full += double(l.gathered);
    } else if (is_expert(l.param->split) && s.expert > 1) {
      expert_elems += double(l.elems);  // averaged over the replicas holding the same experts
    } else {
      replicated_elems += double(l.elems);
    }
  }
  const int d = s.data, dp = averaged(s);
  const bool gpt = m.layers > 0;
  const double micro = s.pipe > 1 ? double(s.microbatches) : 1.0;
  // This device's tokens of a micro-batch: its share of the sequences under context.
  const double tokens = double(s.global_batch) / d / micro * double(s.seq_len) / s.context;
  if (dp > 1) {
    const double rep = replicated_elems * s.grad_bytes;
    const std::string axes = averaged_axes(s);
    if (s.zero_stage == 0) {
      comm.push_back({axes, "all_reduce", 1, ring_all_reduce(dp, rep), "gradients"});
      const int ep = s.data / s.expert * s.context;
      if (expert_elems > 0 && ep > 1)
        comm.push_back({s.context > 1 ? "data,context" : "data", "all_reduce", 1,
                        ring_all_reduce(ep, expert_elems * s.grad_bytes), "experts' gradients"});
    } else {
      comm.push_back({axes, "reduce_scatter", 1, ring_gather(dp, rep), "gradients"});
      comm.push_back({axes, "all_gather", 1, ring_gather(dp, replicated_elems * s.param_bytes),
                      "updated parameters"});
      const int ep = s.data / s.expert * s.context;
      if (expert_elems > 0 && ep > 1) {
        const std::string over = s.context > 1 ? "data,context" : "data";
        comm.push_back({over, "reduce_scatter", 1, ring_gather(ep, expert_elems * s.grad_bytes),
                        "experts' gradients"});
        comm.push_back({over, "all_gather", 1, ring_gather(ep, expert_elems * s.param_bytes),
                        "updated experts"});
      }
    }
  }
  if (d > 1) {
    if (fsdp_full > 0) {
      const int gathers = s.recompute == Recompute::Full ? 2 : 1;
      comm.push_back({"data", "all_gather", gathers,
                      gathers * ring_gather(d, fsdp_full * s.param_bytes),
                      "parameters (FSDP gathers)"});
      comm.push_back({"data", "reduce_scatter", 1, ring_gather(d, fsdp_full * s.grad_bytes),
                      "gradients of fully sharded leaves"});
    }
  }
  if (gpt && s.tensor > 1) {
    const double layers_here = double(m.layers / s.pipe);
    const double x = tokens * double(m.d_model) * s.activation_bytes;  // (b, s, h)
    const double per_layer = s.recompute == Recompute::Full ? 6 : 4;   // fwd 2, bwd 2, recompute 2
    // An MoE layer's experts whole along "model" add none: only its attention's half.
    const double whole_moe = m.moe.tensor_parallel ? 0.0 : double(m.moe_layers()) / s.pipe;
    const double n = (layers_here - whole_moe / 2) * micro * per_layer;
    if (s.sequence_parallel) {
      comm.push_back({"model", "all_gather", std::int64_t(n), n * ring_gather(s.tensor, x),
                      "activations (sequence parallel)"});
      comm.push_back({"model", "reduce_scatter", std::int64_t(n), n * ring_gather(s.tensor, x),
                      "activations (sequence parallel)"});
    } else {
      comm.push_back({"model", "all_reduce", std::int64_t(n), n * ring_all_reduce(s.tensor, x),
                      "activations (Megatron f, g)"});
    }
    if (m.moe.tensor_parallel && m.moe.experts > 0 && !s.sequence_parallel) {
      // The gates meet the experts' partial outputs: their gradient summed over the axis.
      // (With sequence parallelism the gathered tokens' gradient is, in the scatter back.)
      const double calls = double(m.moe_layers()) / s.pipe * micro;
      comm.push_back({"model", "all_reduce", std::int64_t(calls),
                      calls * ring_all_reduce(s.tensor, tokens * double(m.moe.top_k) * 4.0),
                      "MoE gates' gradients (experts split over model)"});
    }
  }
  if (fsdp_full > 0 && s.context > 1)  // the shards' gradients averaged over context too
    comm.push_back({"context", "all_reduce", 1,
                    ring_all_reduce(s.context, fsdp_full / d * s.grad_bytes),
                    "gradients of fully sharded leaves"});
  if (gpt && s.context > 1) {
    // Per layer and micro-batch, this device's share (b, s / cp, h / t) of keys and values.
    const double layers_here = double(m.layers / s.pipe);
    const double x = tokens * double(m.d_model) / s.tensor * 4.0;  // f32 heads
    const double passes = s.recompute == Recompute::Full ? 2 : 1;   // forwards per layer
    const double n = layers_here * micro;
    const double cp = s.context;
    if (s.context_ulysses) {
      // q, k, v to the heads split and the output back; the transposes in backward.
      const double calls = n * (4 * passes + 4);
      comm.push_back({"context", "all_to_all", std::int64_t(calls),
                      calls * x * (cp - 1) / cp, "queries, keys, values, outputs (Ulysses)"});
    } else {
      // Each forward passes k and v (2x) n - 1 hops; the backward passes them again and their
      // gradients n hops.
      const double hops = n * ((cp - 1) * (passes + 1) + cp);
      comm.push_back({"context", "send", std::int64_t(hops), hops * 2 * x,
                      "keys and values around the ring (and their gradients)"});
    }
  }
  if (gpt && s.expert > 1 && m.moe.experts > 0) {
    // Per MoE layer and micro-batch, this device's N tokens (its sequence share with
    // sequence parallelism, unless the experts are split over "model": then the gathered
    // sequence), f32 rows of h.
    const double layers = double(m.moe_layers()) / s.pipe;  // a stage's share
    const double n = double(s.expert), h = double(m.d_model), k = double(m.moe.top_k);
    const double e = double(m.moe.experts);
    const double mine =
        s.sequence_parallel && s.tensor > 1 && !m.moe.tensor_parallel ? tokens / s.tensor : tokens;
    const double calls = layers * micro;
    if (m.moe.all_gather_dispatcher) {
      // Forward: the tokens, gates and choices gathered, the outputs psum_scattered; backward:
      // the tokens' and gates' cotangents scattered, the outputs' gathered.
      comm.push_back({"expert", "all_gather", std::int64_t(4 * calls),
                      calls * (n - 1) * mine * 4.0 * (2.0 * h + 2.0 * k),
                      "tokens, gates, choices, output cotangents (MoE all-gather dispatcher)"});
      comm.push_back({"expert", "reduce_scatter", std::int64_t(3 * calls),
                      calls * (n - 1) * mine * 4.0 * (2.0 * h + k),
                      "outputs, token and gate cotangents (MoE all-gather dispatcher)"});
    } else {
      // Counts first, then the rows there and back, forward and backward, planned padded to
      // the largest block (NCCL's exchange; the variable splits of threads and MPI move at
      // most that): at capacity, or dropless at kDroplessPlanningFactor.
      const double rows = k * (m.moe.capacity_factor < 0 ? kDroplessPlanningFactor
                                                         : m.moe.capacity_factor) * mine;
      comm.push_back({"expert", "all_gather", std::int64_t(calls), calls * (n - 1) * e * 4.0,
                      "tokens per expert (MoE dispatch counts)"});
      comm.push_back({"expert", "all_to_all", std::int64_t(4 * calls),
                      4.0 * calls * (n - 1) / n * rows * h * 4.0,
                      m.moe.capacity_factor < 0
                          ? "MoE rows there and back (dropless: planned at capacity factor 1.25)"
                          : "MoE rows there and back (at capacity)"});
    }
  }
  if (gpt && s.pipe > 1) {
    const double x =
        tokens * double(m.d_model) * s.activation_bytes / (s.sequence_parallel ? s.tensor : 1);
    // An inner stage sends each micro-batch's activation forward and its gradient back.
    comm.push_back({"pipe", "send", 2 * s.microbatches, 2.0 * double(s.microbatches) * x,
                    "activations and their gradients"});
  }
  return comm;
}

}  // namespace

Plan make_plan(const ModelDescription& m, const Setup& s) {
  check_setup(m, s);
  Plan best;
  std::vector<detail::LocalLeaf> best_leaves;
  for (int stage = 0; stage < s.pipe; ++stage) {
    std::vector<detail::LocalLeaf> leaves = detail::stage_leaves(m, s, stage);
    Plan p = stage_plan(m, s, stage, leaves);
    if (stage == 0 || p.total() > best.total()) {
      best = std::move(p);
      best_leaves = std::move(leaves);
    }
  }
  best.comm = stage_comm(m, s, best_leaves);
  return best;
}

namespace {

std::string gib(double bytes) {
  char buf[32];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  }
  return buf;
}

}  // namespace

std::string Plan::str() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%s, %lld parameters (%.3g B); %s, %d devices\n",
                model_name.c_str(), static_cast<long long>(model_params),
                double(model_params) / 1e9, describe_setup(setup).c_str(), setup.world());
  out += line;
  std::snprintf(line, sizeof line, "parameters per device: %.4g (%.3g B)\n", params_per_device,
                params_per_device / 1e9);
  out += line;
  if (setup.pipe > 1) {
    std::snprintf(line, sizeof line, "the busiest device: pipeline stage %d of %d\n", stage,
                  setup.pipe);
    out += line;
  }
  out += "memory per device (bytes; GB = 1e9):\n";
  auto row = [&](const char* name, double v) {
    std::snprintf(line, sizeof line, "  %-18s %16.0f  %12s\n", name, v, gib(v).c_str());
    out += line;
  };
  row("parameters", parameters);
  row("gradients", gradients);
  row("optimizer state", optimizer_state);
  row("activations", activations);
  row("total", total());
  std::snprintf(line, sizeof line, "activation model: %s\n", setup.activations.name.c_str());
  out += line;
  out += "communication per step per device (bytes sent, ring algorithms):\n";
  if (comm.empty()) out += "  none\n";
  for (const CommEntry& e : comm) {
    std::snprintf(line, sizeof line, "  %-6s %-15s %6lld calls %16.0f  %12s  %s\n", e.axis.c_str(),
                  e.kind.c_str(), static_cast<long long>(e.calls), e.bytes, gib(e.bytes).c_str(),
                  e.what.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  total %37.0f  %12s\n", comm_bytes(),
                gib(comm_bytes()).c_str());
  out += line;
  return out;
}

ModelDescription model_from_config(const config::TrainConfig& c) {
  const std::string& p = c.run.program;
  if (p == "gpt") {
    MoEShape moe;
    const config::MoEConfig& mc = c.model.moe;
    if (mc.experts > 0) {
      moe = {.experts = mc.experts,
             .top_k = mc.top_k,
             .hidden = mc.hidden > 0 ? mc.hidden : 4 * c.model.d_model,
             .every = mc.every,
             .swiglu = mc.activation == "swiglu",
             .bias = mc.balance_bias_rate > 0,
             .capacity_factor = mc.capacity_factor,
             .all_gather_dispatcher = mc.dispatcher == "all_gather",
             .tensor_parallel = mc.expert_tensor_parallel};
      moe.shared_hidden = mc.shared_experts * moe.hidden;
    }
    return describe_gpt(c.model.vocab > 0 ? c.model.vocab : 256, c.model.d_model, c.model.layers,
                        c.model.heads, c.data.seq_len, c.parallelism.vocab_parallel,
                        c.model.tie_embeddings, moe);
  }
  if (p == "classifier")
    return describe_classifier(784, c.model.hidden, 10);
  DISTJAX_CHECK(false, NotImplemented, "[plan] run.program = \"", p,
                "\" has no planning model (gpt and classifier do)");
  return {};
}

config::Shard shard_of(const Setup& s) {
  if (s.fsdp) return config::Shard::Parameters;
  return s.zero_stage == 1   ? config::Shard::Optimizer
         : s.zero_stage == 2 ? config::Shard::Gradients
                             : config::Shard::None;
}

Setup setup_from_config(const config::TrainConfig& c) {
  Setup s;
  const config::DistributedConfig& dc = c.distributed;
  s.tensor = dc.enabled ? dc.tensor_parallel_size : 1;
  s.pipe = dc.enabled ? dc.pipeline_parallel_size : 1;
  s.data = dc.enabled ? std::max(1, dc.data_parallel_size()) : 1;
  s.context = dc.enabled ? dc.context_parallel_size : 1;
  s.expert = dc.enabled ? dc.expert_parallel_size : 1;
  s.context_ulysses = c.parallelism.context_parallel_method == "ulysses";
  s.fsdp = c.parallelism.shard == config::Shard::Parameters;
  s.zero_stage = s.fsdp ? 0 : config::zero_stage(c.parallelism.shard);
  s.fsdp_min_weight_size = c.parallelism.fsdp.min_weight_size;
  s.sequence_parallel = c.parallelism.sequence_parallel;
  // Whole blocks recomputed: the full-recompute model; "Attn" / "MLP" alone are planned as
  // no recompute (an upper bound).
  s.recompute = std::find(c.parallelism.remat.begin(), c.parallelism.remat.end(), "Block") !=
                        c.parallelism.remat.end()
                    ? Recompute::Full
                    : Recompute::None;
  const std::string& sch = c.parallelism.schedule;
  s.schedule = sch == "gpipe"            ? PipeSchedule::GPipe
               : sch == "interleaved"    ? PipeSchedule::Interleaved
               : sch == "interleaved_zb" ? PipeSchedule::InterleavedZeroBubble
               : sch == "zbh1"           ? PipeSchedule::ZeroBubble
                                         : PipeSchedule::OneFOneB;
  s.microbatches = c.parallelism.microbatches;
  s.virtual_stages = static_cast<int>(c.parallelism.virtual_stages);
  s.global_batch = c.run.batch_size;
  const bool gpt = c.run.program == "gpt";
  s.seq_len = gpt ? c.data.seq_len : 1;
  if (dc.mixed_precision != config::MixedPrecision::No) {
    // 16-bit parameters, gradients and activations; f32 master weights and Adam moments
    // (the ZeRO paper's 2 + 2 + 12 bytes per parameter).
    s.param_bytes = s.grad_bytes = s.activation_bytes = 2;
    s.master_weights = true;
    s.activations = activation_model_megatron();
  }
  return s;
}

config::TrainConfig apply_setup(config::TrainConfig c, const Setup& s) {
  config::DistributedConfig& d = c.distributed;
  d.enabled = d.enabled || s.world() > 1;
  d.world_size = s.world();
  d.num_processes_per_node = 0;  // derived again from the new world size
  d.tensor_parallel_size = s.tensor;
  d.pipeline_parallel_size = s.pipe;
  d.context_parallel_size = s.context;
  d.expert_parallel_size = s.expert;
  d.mesh_shape.clear();
  d.mesh_axis_names.clear();
  c.parallelism.shard = shard_of(s);
  if (!s.fsdp) c.parallelism.fsdp.modules.clear();
  c.parallelism.microbatches = s.pipe > 1 ? s.microbatches : 1;  // they split a pipe's batch
  return c;
}

namespace {

/// Whether the program runs setup `s` (its mesh axes and data-parallel sharding) and the
/// library's pipeline takes it.
bool runs_setup(const config::ProgramCapabilities& runs, const Setup& s) {
  if (runs.max_devices > 0 && s.world() > runs.max_devices) return false;
  if ((s.tensor > 1 && !runs.tensor_parallel) || (s.pipe > 1 && !runs.pipeline_parallel))
    return false;
  if (!runs.runs(shard_of(s))) return false;
  return s.pipe == 1 || s.zero_stage != 2;  // ZeRO-2 reduce-scatters inside its own backward
}

}  // namespace

std::vector<Plan> meshes_that_fit(const ModelDescription& m, const Setup& base, int world,
                                  double budget_bytes, const config::ProgramCapabilities& runs) {
  std::vector<Plan> out;
  const bool gpt = m.layers > 0;
  // The context axis stays as `base` has it; the rest of the devices factor into the others.
  if (world % base.context != 0) return out;
  world /= base.context;
  for (int t = 1; t <= world; ++t) {
    if (world % t != 0 || (gpt && m.heads % t != 0) || (!gpt && t > 1)) continue;
    for (int p = 1; p <= world / t; ++p) {
      if ((world / t) % p != 0 || (gpt && m.layers % p != 0) || (!gpt && p > 1)) continue;
      const int d = world / (t * p);
      if (base.global_batch % d != 0 || d % base.expert != 0) continue;
      for (int variant = 0; variant < 4; ++variant) {
        if (d == 1 && variant > 0) continue;
        Setup s = base;
        s.data = d;
        s.tensor = t;
        s.pipe = p;
        s.zero_stage = variant < 3 ? variant : 0;
        s.fsdp = variant == 3;
        if (p > 1 && s.microbatches < p) s.microbatches = p;
        if (!runs_setup(runs, s)) continue;
        try {
          Plan plan = make_plan(m, s);
          if (plan.total() <= budget_bytes) out.push_back(std::move(plan));
        } catch (const Error&) {
          // a mesh the model or the schedule does not split over: not a candidate
        }
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Plan& a, const Plan& b) { return a.total() < b.total(); });
  return out;
}

}  // namespace distjax::plan
