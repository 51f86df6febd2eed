#include "distjax/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>

#include "distjax/core/error.hpp"

namespace distjax::plan {

std::int64_t ParamInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
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
  m.layer_replicated = 10;   // layer norms' inputs, dropout masks, residual: 10 s b h
  m.layer_split = 24;        // QKV, attention output, MLP activations: 24 s b h / t
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
  m.layer_replicated = 64;  // 16 f32 tensors of (b, s, h) per block, kept along "model"
  m.layer_per_head = 8;     // the fused attention's max and sum per (head, row)
  m.head_per_vocab = 4;     // logits (b, s, V) f32
  m.head_replicated = 16;   // final norm and the head's input
  m.head_split = 12;
  m.layer_full_remat = 4;  // the block input
  m.layer_selective = -1;  // not implemented: selective recompute plans as none
  m.gradient_bucket_copy = true;
  return m;
}

ModelDescription describe_gpt(std::int64_t vocab, std::int64_t d_model, std::int64_t layers,
                              std::int64_t heads, std::int64_t max_len, bool vocab_parallel,
                              bool tied) {
  const std::int64_t c = d_model;
  ModelDescription m;
  m.name = "gpt";
  m.vocab = vocab;
  m.d_model = c;
  m.layers = layers;
  m.heads = heads;
  auto add = [&](std::string path, std::vector<std::int64_t> shape, TPSplit split, int layer) {
    m.params.push_back({std::move(path), std::move(shape), split, layer});
  };
  add("wte/embedding", {vocab, c}, vocab_parallel ? TPSplit::Vocab : TPSplit::None, -1);
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
    add(b + "mlp/fc1/kernel", {c, 4 * c}, TPSplit::Column, i);
    add(b + "mlp/fc1/bias", {4 * c}, TPSplit::Column, i);
    add(b + "mlp/fc2/kernel", {4 * c, c}, TPSplit::Row, i);
    add(b + "mlp/fc2/bias", {c}, TPSplit::None, i);
  }
  add("ln_f/scale", {c}, TPSplit::None, -1);
  add("ln_f/bias", {c}, TPSplit::None, -1);
  if (!tied) add("lm_head/kernel", {c, vocab}, vocab_parallel ? TPSplit::Column : TPSplit::None, -1);
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

/// One parameter on the first pipeline stage of one device: elements held, and the
/// elements of the whole (tensor-parallel shard of the) leaf when FSDP splits it.
struct LocalLeaf {
  std::int64_t elems = 0;     // stored on this device
  std::int64_t gathered = 0;  // FSDP: elements after the gather (0 = not fully sharded)
  int layer = -1;
};

std::int64_t tp_dim(const ParamInfo& p) {
  switch (p.split) {
    case TPSplit::Column:
      return static_cast<std::int64_t>(p.shape.size()) - 1;
    case TPSplit::Row:
      return p.shape.size() == 2 ? 0 : -1;
    case TPSplit::Vocab:
      return 0;
    case TPSplit::None:
      return -1;
  }
  return -1;
}

std::vector<LocalLeaf> local_leaves(const ModelDescription& m, const Setup& s) {
  const std::int64_t per_stage = m.layers > 0 ? m.layers / s.pipe : 0;
  std::vector<LocalLeaf> out;
  for (const ParamInfo& p : m.params) {
    // The first stage: the embeddings and blocks 0 .. L/p - 1 (the last stage's head is
    // the tied embedding again and its final norm: never more).
    if (s.pipe > 1 && p.layer >= per_stage) continue;
    if (s.pipe > 1 && p.layer < 0 &&
        (p.path.rfind("ln_f", 0) == 0 || p.path.rfind("lm_head", 0) == 0))
      continue;  // on the last stage
    std::vector<std::int64_t> shape = p.shape;
    const std::int64_t d = tp_dim(p);
    if (d >= 0 && s.tensor > 1 && p.split == TPSplit::Vocab) {
      shape[d] = (shape[d] + s.tensor - 1) / s.tensor;  // padded vocabulary, as Megatron's
    } else if (d >= 0 && s.tensor > 1) {
      DISTJAX_CHECK(shape[d] % s.tensor == 0, InvalidArgument, "[plan] parameter \"", p.path,
                    "\" dimension ", d, " of size ", shape[d],
                    " does not split over model = ", s.tensor);
      shape[d] /= s.tensor;
    }
    LocalLeaf leaf;
    leaf.layer = p.layer;
    leaf.elems = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    // mesh::fully_sharded_spec: global size >= min_weight_size and a dimension divisible.
    if (s.fsdp && s.data > 1 && p.numel() >= s.fsdp_min_weight_size &&
        std::any_of(shape.begin(), shape.end(), [&](std::int64_t e) { return e % s.data == 0; })) {
      leaf.gathered = leaf.elems;
      leaf.elems /= s.data;
    }
    out.push_back(leaf);
  }
  return out;
}

double ring_all_reduce(int n, double bytes) {
  return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}
double ring_gather(int n, double bytes) {
  return n > 1 ? double(n - 1) / n * bytes : 0.0;
}

// Micro-batches whose activations the first stage holds at once, in whole-stage units.
double in_flight(const Setup& s) {
  if (s.pipe <= 1) return 1;
  if (s.schedule == PipeSchedule::GPipe) return double(s.microbatches);
  if (s.schedule == PipeSchedule::Interleaved && s.virtual_stages > 1) {
    // (v-1)p + 2(p-1) + 1 chunks of 1/v of a stage (Megatron's p + (p-1)/v), at most m v.
    const std::int64_t v = s.virtual_stages, p = s.pipe;
    return double(std::min<std::int64_t>(s.microbatches * v, (v - 1) * p + 2 * (p - 1) + 1)) /
           double(v);
  }
  return double(std::min<std::int64_t>(s.microbatches, s.pipe));  // 1F1B, ZB-H1: p - stage
}

/// Bytes of activations one transformer layer keeps for `tokens` tokens of one micro-batch.
double layer_activation_bytes(const ModelDescription& m, const Setup& s, double tokens,
                              Recompute r) {
  const ActivationModel& a = s.activations;
  const double h = double(m.d_model), t = s.tensor, seq = double(s.seq_len);
  if (r == Recompute::Full) return tokens * h * a.layer_full_remat / (s.sequence_parallel ? t : 1);
  if (r == Recompute::Selective && a.layer_selective > 0) return tokens * h * a.layer_selective / t;
  const double replicated = a.layer_replicated / (s.sequence_parallel ? t : 1);
  return tokens * (h * (replicated + a.layer_split / t) +
                   double(m.heads) / t * (a.layer_per_head + a.layer_per_head_seq * seq));
}

double head_activation_bytes(const ModelDescription& m, const Setup& s, double tokens) {
  const ActivationModel& a = s.activations;
  const double t = s.tensor;
  const double vocab_share = (a.name == "megatron-16bit") ? double(m.vocab) / t : double(m.vocab);
  return tokens * (vocab_share * a.head_per_vocab +
                   double(m.d_model) * (a.head_replicated + a.head_split / t));
}

}  // namespace

double Plan::comm_bytes() const {
  double b = 0;
  for (const CommEntry& e : comm)
    b += e.bytes;
  return b;
}

std::string describe_setup(const Setup& s) {
  std::string out = "data=" + std::to_string(s.data) + " model=" + std::to_string(s.tensor) +
                    " pipe=" + std::to_string(s.pipe);
  if (s.fsdp) {
    out += " FSDP";
  } else if (s.zero_stage > 0) {
    out += " ZeRO-" + std::to_string(s.zero_stage);
  } else {
    out += " DP";
  }
  return out;
}

Plan make_plan(const ModelDescription& m, const Setup& s) {
  DISTJAX_CHECK(s.data >= 1 && s.tensor >= 1 && s.pipe >= 1, InvalidArgument,
                "[plan] mesh sizes must be positive, got ", describe_setup(s));
  DISTJAX_CHECK(s.global_batch % s.data == 0, InvalidArgument, "[plan] batch ", s.global_batch,
                " does not split over data = ", s.data);
  const bool gpt = m.layers > 0;
  DISTJAX_CHECK(gpt || (s.tensor == 1 && s.pipe == 1), NotImplemented,
                "[plan] the classifier is planned on a (\"data\") mesh only, got ",
                describe_setup(s));
  if (gpt) {
    DISTJAX_CHECK(m.layers % s.pipe == 0, InvalidArgument, "[plan] ", m.layers,
                  " layers do not split over pipe = ", s.pipe);
    DISTJAX_CHECK(m.heads % s.tensor == 0, InvalidArgument, "[plan] ", m.heads,
                  " heads do not split over model = ", s.tensor);
  }
  Plan plan;
  plan.setup = s;
  plan.model_name = m.name;
  plan.model_params = m.num_params();

  // State: parameters, gradients and optimizer slots of the leaves this device holds.
  const std::vector<LocalLeaf> leaves = local_leaves(m, s);
  double elems = 0, replicated_elems = 0, fsdp_full = 0, fsdp_full_layer = 0;
  for (const LocalLeaf& l : leaves) {
    elems += double(l.elems);
    if (l.gathered > 0) {
      fsdp_full += double(l.gathered);
    } else {
      replicated_elems += double(l.elems);
    }
  }
  for (const LocalLeaf& l : leaves)  // one block's gathered leaves (remat frees them after use)
    if (l.layer == 0) fsdp_full_layer += double(l.gathered);
  const int d = s.data;
  plan.params_per_device = elems;
  plan.parameters = elems * s.param_bytes;
  plan.gradients = elems * s.grad_bytes / (s.zero_stage >= 2 ? d : 1);
  plan.optimizer_state = elems * (s.optimizer_slots * s.state_bytes + (s.master_weights ? 4 : 0)) /
                         (s.zero_stage >= 1 ? d : 1);

  // Activation peak: the larger of two moments of the step.
  //  (1) the end of forward: every saved activation of the micro-batches in flight, the
  //      head's, and the data-parallel buckets (allocated when backward starts);
  //  (2) the end of backward: the gradients (and a bucket copy of them when they are
  //      all-reduced), FSDP's gathered weights and their full gradients before the
  //      reduce-scatter, the first layer's input.
  const double b_local = double(s.global_batch) / d / (s.pipe > 1 ? double(s.microbatches) : 1.0);
  const double tokens = b_local * double(s.seq_len);
  const double grad_local = elems * s.grad_bytes;
  const bool copy = s.activations.gradient_bucket_copy;
  const double bucket = copy && d > 1 && !s.fsdp && s.zero_stage == 0 ? grad_local : 0.0;
  double end_of_forward = 0, end_of_backward = 0;
  if (gpt) {
    const double layers_here = double(m.layers / s.pipe);
    double saved =
        layers_here * in_flight(s) * layer_activation_bytes(m, s, tokens, s.recompute);
    // Recomputation rebuilds one block's activations in backward.
    if (s.recompute != Recompute::None)
      saved += layer_activation_bytes(m, s, tokens, Recompute::None);
    if (s.pipe == 1) saved += head_activation_bytes(m, s, tokens);
    end_of_forward = saved + bucket;
  } else {
    // Classifier: fc1's output, silu's output, the dropout mask and output (h each), the
    // logits (K), f32.
    end_of_forward = b_local * 4.0 * double(4 * m.hidden + m.num_classes) + bucket;
  }
  const double gathered = s.recompute == Recompute::Full ? fsdp_full_layer : fsdp_full;
  // (Without the bucket copy the gradients are the state's own, counted once, not here.)
  end_of_backward =
      grad_local * (copy ? (d > 1 ? 2.0 : 1.0) : 0.0) + (fsdp_full * s.grad_bytes) +
      gathered * s.param_bytes +
      (gpt ? tokens * double(m.d_model) * s.activation_bytes : b_local * 4.0 * double(m.hidden));
  plan.activations = std::max(end_of_forward, end_of_backward);

  // Communication per step of this device (ring figures, as comm::CommStats counts).
  if (d > 1) {
    const double rep = replicated_elems * s.grad_bytes;
    if (s.zero_stage == 0) {
      plan.comm.push_back({"data", "all_reduce", 1, ring_all_reduce(d, rep), "gradients"});
    } else {
      plan.comm.push_back({"data", "reduce_scatter", 1, ring_gather(d, rep), "gradients"});
      plan.comm.push_back({"data", "all_gather", 1,
                           ring_gather(d, replicated_elems * s.param_bytes), "updated parameters"});
    }
    if (fsdp_full > 0) {
      const int gathers = s.recompute == Recompute::Full ? 2 : 1;
      plan.comm.push_back({"data", "all_gather", gathers,
                           gathers * ring_gather(d, fsdp_full * s.param_bytes),
                           "parameters (FSDP gathers)"});
      plan.comm.push_back({"data", "reduce_scatter", 1, ring_gather(d, fsdp_full * s.grad_bytes),
                           "gradients of fully sharded leaves"});
    }
  }
  if (gpt && s.tensor > 1) {
    const double layers_here = double(m.layers / s.pipe);
    const double micro = s.pipe > 1 ? double(s.microbatches) : 1.0;
    const double x = tokens * double(m.d_model) * s.activation_bytes;  // (b, s, h)
    const double per_layer = s.recompute == Recompute::Full ? 6 : 4;   // fwd 2, bwd 2, recompute 2
    const double n = layers_here * micro * per_layer;
    if (s.sequence_parallel) {
      plan.comm.push_back({"model", "all_gather", std::int64_t(n), n * ring_gather(s.tensor, x),
                           "activations (sequence parallel)"});
      plan.comm.push_back({"model", "reduce_scatter", std::int64_t(n), n * ring_gather(s.tensor, x),
                           "activations (sequence parallel)"});
    } else {
      plan.comm.push_back({"model", "all_reduce", std::int64_t(n), n * ring_all_reduce(s.tensor, x),
                           "activations (Megatron f, g)"});
    }
  }
  if (gpt && s.pipe > 1) {
    const double x =
        tokens * double(m.d_model) * s.activation_bytes / (s.sequence_parallel ? s.tensor : 1);
    // An inner stage sends each micro-batch's activation forward and its gradient back.
    plan.comm.push_back({"pipe", "send", 2 * s.microbatches, 2.0 * double(s.microbatches) * x,
                         "activations and their gradients"});
  }
  return plan;
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
  if (p == "gpt" || p == "train_gpt")
    return describe_gpt(c.model.vocab > 0 ? c.model.vocab : 256, c.model.d_model, c.model.layers,
                        c.model.heads, c.data.seq_len, c.parallelism.vocab_parallel,
                        // the gpt program unties the head when it has a pipe axis
                        !(p == "gpt" && c.distributed.pipeline_parallel_size > 1));
  if (p == "data_parallelism" || p == "train_mnist")
    return describe_classifier(784, c.model.hidden, 10);
  DISTJAX_CHECK(false, NotImplemented, "[plan] run.program = \"", p,
                "\" has no planning model (gpt, train_gpt, data_parallelism, train_mnist do)");
  return {};
}

Setup setup_from_config(const config::TrainConfig& c) {
  Setup s;
  const config::DistributedConfig& dc = c.distributed;
  s.tensor = dc.enabled ? dc.tensor_parallel_size : 1;
  s.pipe = dc.enabled ? dc.pipeline_parallel_size : 1;
  s.data = dc.enabled ? std::max(1, dc.data_parallel_size()) : 1;
  s.zero_stage = c.parallelism.zero_stage;
  s.fsdp = !c.parallelism.fsdp.modules.empty();
  s.fsdp_min_weight_size = c.parallelism.fsdp.min_weight_size;
  s.sequence_parallel = c.parallelism.sequence_parallel;
  // Whole blocks recomputed: the full-recompute model; "Attn" / "MLP" alone are planned as
  // no recompute (an upper bound).
  s.recompute = std::find(c.parallelism.remat.begin(), c.parallelism.remat.end(), "Block") !=
                        c.parallelism.remat.end()
                    ? Recompute::Full
                    : Recompute::None;
  const std::string& sch = c.parallelism.schedule;
  s.schedule = sch == "gpipe"         ? PipeSchedule::GPipe
               : sch == "interleaved" || sch == "interleaved_zb" ? PipeSchedule::Interleaved
               : sch == "zbh1"        ? PipeSchedule::ZeroBubble
                                      : PipeSchedule::OneFOneB;
  s.microbatches = c.parallelism.microbatches;
  s.virtual_stages = static_cast<int>(c.parallelism.virtual_stages);
  s.global_batch = c.run.batch_size;
  const bool gpt = c.run.program == "gpt" || c.run.program == "train_gpt";
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

std::vector<Plan> meshes_that_fit(const ModelDescription& m, const Setup& base, int world,
                                  double budget_bytes) {
  std::vector<Plan> out;
  const bool gpt = m.layers > 0;
  for (int t = 1; t <= world; ++t) {
    if (world % t != 0 || (gpt && m.heads % t != 0) || (!gpt && t > 1)) continue;
    for (int p = 1; p <= world / t; ++p) {
      if ((world / t) % p != 0 || (gpt && m.layers % p != 0) || (!gpt && p > 1)) continue;
      const int d = world / (t * p);
      if (base.global_batch % d != 0) continue;
      for (int variant = 0; variant < 4; ++variant) {
        if (d == 1 && variant > 0) continue;
        Setup s = base;
        s.data = d;
        s.tensor = t;
        s.pipe = p;
        s.zero_stage = variant < 3 ? variant : 0;
        s.fsdp = variant == 3;
        if (p > 1 && s.microbatches < p) s.microbatches = p;
        if (p > 1 && (s.global_batch / d) % s.microbatches != 0) continue;
        if (p > 1 && s.fsdp) continue;  // pipelines shard over "data" with ZeRO-1/2 only
        try {
          Plan plan = make_plan(m, s);
          if (plan.total() <= budget_bytes) out.push_back(std::move(plan));
        } catch (const Error&) {
          // a mesh the model does not split over: not a candidate
        }
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Plan& a, const Plan& b) { return a.total() < b.total(); });
  return out;
}

}  // namespace distjax::plan
