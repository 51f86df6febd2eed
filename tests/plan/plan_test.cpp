// The plan against what runs measure: three setups trained for a few AdamW steps on the
// threads backend (the classifier data parallel, the classifier fully sharded, the GPT
// Megatron tensor parallel x data parallel), each figure of spmd::DeviceContext::memory()
// within 10% of plan::make_plan's, and the communication per step equal to the comm
// counters (up to the few bytes of the metrics' all-reduce). Also: the analytic model
// descriptions equal the models' own init, and the GPT-3 175B example of docs/plan.md.
#include "distjax/plan/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"
#include "parallel/parity_util.hpp"
#include "spmd/spmd_test_util.hpp"

namespace distjax::plan {
namespace {

using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;
using tensor::TensorTree;

constexpr int kSteps = 3;

/// Device 0's memory after the last step and its communication during that step.
struct Measured {
  MemoryStats mem;
  comm::CommStats comm;
  std::int64_t sent(const std::string& axis, comm::OpKind k) const {
    return comm.of(axis, k).bytes_sent;
  }
};

const optim::AdamW& adamw() {
  static const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-3),
                                 .weight_decay = 1e-2,
                                 .decay_mask = optim::default_decay_mask()});
  return opt;
}

/// The classifier (784 -> hidden -> 10) on ("data"=n), plain DP or FSDP (2^18).
Measured run_classifier(int n, std::int64_t batch, std::int64_t hidden, bool fsdp_on) {
  const models::Classifier model(
      {.in_features = 784, .hidden = hidden, .num_classes = 10, .dropout = 0.1f});
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = std::int64_t{1} << 18};
  Measured out;
  spmd::shard_map(
      Mesh({n}, {"data"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        TensorTree params = model.init(Key::from_seed(1), &specs, &ctx, fsdp_on ? &fsdp : nullptr);
        parallel::DataParallel dp(ctx, "data", &specs,
                                  {.fully_sharded = fsdp_on ? mesh::Axes("data") : mesh::Axes()});
        auto state = train::TrainState::create(params, adamw(), Key::from_seed(2), dp);
        const train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
          nn::Scope sc = nn::Scope::apply(&p, true, k).on(ctx);
          if (fsdp_on) sc = sc.fully_sharded(fsdp);
          return std::make_pair(tensor::mean(tensor::cross_entropy(model(sc, b.inputs), b.labels)),
                                train::Metrics{});
        };
        const std::int64_t per = batch / n;
        for (int step = 0; step < kSteps; ++step) {
          const Key k = Key::from_seed(3).fold_in(static_cast<std::uint64_t>(step));
          Tensor x = testing::random_tensor(k, {per, 784});
          Tensor y = Tensor::empty({per}, DType::I32);
          for (std::int64_t i = 0; i < per; ++i)
            y.data<std::int32_t>()[i] =
                static_cast<std::int32_t>(k.fold_in(50 + i).bits(0)[0] % 10);
          ctx.comm_stats().reset();
          train::train_step(state, {x, y}, fn, adamw(), {.strategy = &dp});
          if (ctx.device() == 0 && step == kSteps - 1) {
            out.mem = ctx.memory();
            out.comm = ctx.comm_stats();
          }
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  return out;
}

struct GptSizes {
  std::int64_t batch = 16, seq = 64, d_model = 128, layers = 2, heads = 4;
};

/// A GPT (vocab 256) of `config`'s sizes trained on `mesh`, its gradients averaged over
/// `averaged`, each device on `local(ctx, batch)` of every global batch: device 0's memory
/// after the last step and its communication during it.
using LocalBatch = std::function<train::Batch(DeviceContext&, const train::Batch&)>;
Measured run_gpt_on(const Mesh& mesh, const models::TransformerConfig& config,
                    const mesh::Axes& averaged, const GptSizes& z, const LocalBatch& local,
                    const mesh::Axes& expert = {}, int zero_stage = 0) {
  const models::Transformer model(config);
  Measured out;
  const auto data = testing::random_token_batches(kSteps, z.batch, z.seq, 256, 7);
  spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        std::unique_ptr<train::Strategy> strategy;
        if (zero_stage > 0)
          strategy = std::make_unique<parallel::ZeroDataParallel>(ctx, zero_stage, averaged,
                                                                  &specs,
                                                                  parallel::DataParallelOptions{
                                                                      .expert = expert});
        else
          strategy = std::make_unique<parallel::DataParallel>(
              ctx, averaged, &specs, parallel::DataParallelOptions{.expert = expert});
        train::Strategy& dp = *strategy;
        auto state = train::TrainState::create(model.init(Key::from_seed(1), &specs, &ctx), adamw(),
                                               Key::from_seed(2), dp);
        const train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
          const nn::Scope sc = nn::Scope::apply(&p, true, k).on(ctx);
          return std::make_pair(model.loss(sc, b.inputs, b.labels), train::Metrics{});
        };
        for (int step = 0; step < kSteps; ++step) {
          ctx.comm_stats().reset();
          train::train_step(state, local(ctx, data[step]), fn, adamw(), {.strategy = &dp});
          if (ctx.device() == 0 && step == kSteps - 1) {
            out.mem = ctx.memory();
            out.comm = ctx.comm_stats();
          }
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  return out;
}

models::TransformerConfig gpt_of(const GptSizes& z) {
  return {.vocab = 256,
          .d_model = z.d_model,
          .num_layers = z.layers,
          .num_heads = z.heads,
          .max_len = z.seq};
}

/// The GPT on ("data"=nd, "model"=nm), Megatron layout, data parallel.
Measured run_gpt(int nd, int nm, const GptSizes& z) {
  models::TransformerConfig c = gpt_of(z);
  c.tp = {.layout = nm > 1 ? parallel::TPLayout::Megatron : parallel::TPLayout::None};
  return run_gpt_on(Mesh({nd, nm}, {"data", "model"}), c, "data", z,
                    [&](DeviceContext& ctx, const train::Batch& b) {
                      const int r = ctx.axis_index("data");
                      const std::int64_t per = z.batch / nd;
                      return b.slice(r * per, (r + 1) * per);
                    });
}

/// The GPT with its sequence split over ("context"=n), ring attention or Ulysses, the
/// gradients averaged over the axis.
Measured run_gpt_context(int n, bool ulysses, const GptSizes& z) {
  models::TransformerConfig c = gpt_of(z);
  c.cp = {.layout = {.size = n},
          .method = ulysses ? parallel::ContextMethod::Ulysses : parallel::ContextMethod::Ring};
  return run_gpt_on(Mesh({n}, {"context"}), c, "context", z,
                    [&](DeviceContext& ctx, const train::Batch& b) {
                      const int me = ctx.axis_index("context");
                      return b.map([&](const Tensor& t) { return c.cp.layout.shard(t, 1, me); });
                    });
}

void expect_within(double predicted, double measured, double tol, const std::string& what) {
  EXPECT_LE(std::abs(predicted - measured), tol * measured)
      << what << ": predicted " << predicted << ", measured " << measured << " ("
      << 100.0 * (predicted - measured) / measured << "%)";
}

void expect_memory_within_10_percent(const Plan& p, const MemoryStats& m, const std::string& what) {
  std::printf(
      "%s\n  predicted: params %.0f grads %.0f optim %.0f activations %.0f total %.0f\n"
      "  measured:  params %lld grads %lld optim %lld activations %lld total %lld\n",
      what.c_str(), p.parameters, p.gradients, p.optimizer_state, p.activations, p.total(),
      static_cast<long long>(m.parameters), static_cast<long long>(m.gradients),
      static_cast<long long>(m.optimizer_state), static_cast<long long>(m.activations_peak),
      static_cast<long long>(m.total()));
  expect_within(p.parameters, double(m.parameters), 0.10, what + " parameters");
  expect_within(p.gradients, double(m.gradients), 0.10, what + " gradients");
  expect_within(p.optimizer_state, double(m.optimizer_state), 0.10, what + " optimizer state");
  expect_within(p.activations, double(m.activations_peak), 0.10, what + " activations");
  expect_within(p.total(), double(m.total()), 0.10, what + " total");
}

double planned(const Plan& p, const std::string& axis, const std::string& kind) {
  double b = 0;
  for (const CommEntry& e : p.comm)
    if (e.axis == axis && e.kind == kind) b += e.bytes;
  return b;
}

// The metrics' own all-reduce and gather (loss, counts: a few f64) ride on the same axes.
constexpr double kMetricBytes = 128;

plan::Setup classifier_setup(int n, std::int64_t batch, bool fsdp) {
  plan::Setup s;
  s.data = n;
  s.fsdp = fsdp;
  s.global_batch = batch;
  return s;
}

TEST(Plan, ClassifierDataParallelMatchesTheRun) {
  const Plan p = make_plan(describe_classifier(784, 512, 10), classifier_setup(4, 64, false));
  const Measured m = run_classifier(4, 64, 512, false);
  expect_memory_within_10_percent(p, m.mem, "classifier DP data=4");
  EXPECT_NEAR(planned(p, "data", "all_reduce"), double(m.sent("data", comm::OpKind::AllReduce)),
              kMetricBytes);
}

TEST(Plan, ClassifierFullyShardedMatchesTheRun) {
  const Plan p = make_plan(describe_classifier(784, 512, 10), classifier_setup(4, 64, true));
  const Measured m = run_classifier(4, 64, 512, true);
  expect_memory_within_10_percent(p, m.mem, "classifier FSDP data=4");
  EXPECT_NEAR(planned(p, "data", "all_reduce"), double(m.sent("data", comm::OpKind::AllReduce)),
              kMetricBytes);
  EXPECT_NEAR(planned(p, "data", "all_gather"), double(m.sent("data", comm::OpKind::AllGather)),
              kMetricBytes);
  EXPECT_EQ(planned(p, "data", "reduce_scatter"),
            double(m.sent("data", comm::OpKind::ReduceScatter)));
}

TEST(Plan, GptTensorParallelMatchesTheRun) {
  const GptSizes z;
  plan::Setup s;
  s.data = 2;
  s.tensor = 2;
  s.global_batch = z.batch;
  s.seq_len = z.seq;
  const Plan p = make_plan(describe_gpt(256, z.d_model, z.layers, z.heads, z.seq), s);
  const Measured m = run_gpt(2, 2, z);
  expect_memory_within_10_percent(p, m.mem, "GPT Megatron data=2 model=2");
  // Megatron's f and g: 2 all-reduces of (b, s, h) per layer forward, 2 backward.
  EXPECT_EQ(planned(p, "model", "all_reduce"), double(m.sent("model", comm::OpKind::AllReduce)));
  EXPECT_NEAR(planned(p, "data", "all_reduce"), double(m.sent("data", comm::OpKind::AllReduce)),
              kMetricBytes);
}

// Ring attention passes k and v (n - 1 hops per layer forward, n - 1 again backward with their
// gradients n hops); Ulysses trades q, k, v and the output by all-to-all, 4 forward and 4
// backward per layer; the gradients are averaged over the context axis.
TEST(Plan, GptContextParallelMatchesTheRun) {
  const GptSizes z{.batch = 2, .seq = 512, .d_model = 64, .layers = 2, .heads = 4};
  for (const bool ulysses : {false, true}) {
    plan::Setup s;
    s.context = 4;
    s.context_ulysses = ulysses;
    s.global_batch = z.batch;
    s.seq_len = z.seq;
    const Plan p = make_plan(describe_gpt(256, z.d_model, z.layers, z.heads, z.seq), s);
    const Measured m = run_gpt_context(4, ulysses, z);
    const std::string what = ulysses ? "GPT Ulysses context=4" : "GPT ring context=4";
    expect_memory_within_10_percent(p, m.mem, what);
    if (ulysses) {
      EXPECT_EQ(planned(p, "context", "all_to_all"),
                double(m.sent("context", comm::OpKind::AllToAll)))
          << what;
    } else {
      EXPECT_EQ(planned(p, "context", "send"), double(m.sent("context", comm::OpKind::Send)))
          << what;
    }
    EXPECT_NEAR(planned(p, "data,context", "all_reduce"),
                double(m.sent("context", comm::OpKind::AllReduce)), kMetricBytes)
        << what;
  }
}

// The MoE GPT with its experts over ("expert"=4), a capacity factor of 1 (the exchange's
// rows padded to a full capacity block): the state exactly (experts split by 4, the rest
// whole), the exchange's all_to_all bytes as an upper bound (the plan counts every block
// padded to a full capacity, as NCCL's padded exchange moves; the variable splits of the
// threads backend move only the kept rows that cross devices: 61% of it here) and counts
// exactly, the gradients' all-reduce of
// the parameters outside the experts; the activation figure is conservative (at least the
// measured peak, at most twice it: the MoE layer's terms are upper bounds, docs/plan.md).
TEST(Plan, GptMoeExpertParallelMatchesTheRun) {
  const GptSizes z;
  const int n = 4;
  models::TransformerConfig c = gpt_of(z);
  c.moe_every = 1;
  c.moe = {.num_experts = 8, .top_k = 2, .hidden = 256, .capacity_factor = 1.0};
  const Measured m = run_gpt_on(
      Mesh({n}, {"expert"}), c, "expert", z,
      [&](DeviceContext& ctx, const train::Batch& b) {
        const int r = ctx.axis_index("expert");
        const std::int64_t per = z.batch / n;
        return b.slice(r * per, (r + 1) * per);
      },
      "expert");
  plan::Setup s;
  s.data = n;
  s.expert = n;
  s.global_batch = z.batch;
  s.seq_len = z.seq;
  const MoEShape moe{.experts = 8, .top_k = 2, .hidden = 256, .capacity_factor = 1.0};
  const Plan p =
      make_plan(describe_gpt(256, z.d_model, z.layers, z.heads, z.seq, false, true, moe), s);
  const std::string what = "MoE GPT expert=4, capacity 1";
  std::printf("%s\n  predicted activations %.0f, measured %lld\n", what.c_str(), p.activations,
              static_cast<long long>(m.mem.activations_peak));
  EXPECT_EQ(p.parameters, double(m.mem.parameters)) << what;
  EXPECT_EQ(p.gradients, double(m.mem.gradients)) << what;
  EXPECT_EQ(p.optimizer_state, double(m.mem.optimizer_state)) << what;
  EXPECT_GE(p.activations, double(m.mem.activations_peak)) << what;
  EXPECT_LE(p.activations, 2.0 * double(m.mem.activations_peak)) << what;
  const double exchanged = double(m.sent("expert", comm::OpKind::AllToAll));
  EXPECT_GE(planned(p, "expert", "all_to_all"), exchanged) << what;
  EXPECT_GE(exchanged, 0.5 * planned(p, "expert", "all_to_all")) << what;
  EXPECT_NEAR(planned(p, "expert", "all_gather"), double(m.sent("expert", comm::OpKind::AllGather)),
              kMetricBytes);
  EXPECT_NEAR(planned(p, "data,expert", "all_reduce"),
              double(m.sent("expert", comm::OpKind::AllReduce)), kMetricBytes);
}

// The MoE GPT on ("data"=2, "expert"=2) under ZeRO-1 and ZeRO-2: the experts, split over
// "expert", are split by ZeRO over "data" (the replicas holding the same experts), the rest
// over both axes: the optimizer state and (ZeRO-2) the gradients exactly, and the experts'
// reduce-scatter and all-gather over "data" to the byte.
TEST(Plan, GptMoeUnderZeroSplitsTheExpertsOverTheirReplicas) {
  const GptSizes z;
  models::TransformerConfig c = gpt_of(z);
  c.moe_every = 1;
  c.moe = {.num_experts = 4, .top_k = 2, .hidden = 128, .capacity_factor = 1.0};
  const MoEShape moe{.experts = 4, .top_k = 2, .hidden = 128, .capacity_factor = 1.0};
  for (const int stage : {1, 2}) {
    const mesh::Axes both(std::vector<std::string>{"data", "expert"});
    const Measured m = run_gpt_on(
        Mesh({2, 2}, {"data", "expert"}), c, both, z,
        [&](DeviceContext& ctx, const train::Batch& b) {
          const int r = ctx.axis_index(both);
          const std::int64_t per = z.batch / 4;
          return b.slice(r * per, (r + 1) * per);
        },
        "expert", stage);
    plan::Setup s;
    s.data = 4;
    s.expert = 2;
    s.zero_stage = stage;
    s.global_batch = z.batch;
    s.seq_len = z.seq;
    const Plan p =
        make_plan(describe_gpt(256, z.d_model, z.layers, z.heads, z.seq, false, true, moe), s);
    const std::string what = "MoE GPT data 2 x expert 2, ZeRO-" + std::to_string(stage);
    EXPECT_EQ(p.parameters, double(m.mem.parameters)) << what;
    EXPECT_EQ(p.optimizer_state, double(m.mem.optimizer_state)) << what;
    if (stage == 2) EXPECT_EQ(p.gradients, double(m.mem.gradients)) << what;
    EXPECT_NEAR(planned(p, "data", "reduce_scatter"),
                double(m.sent("data", comm::OpKind::ReduceScatter)), kMetricBytes)
        << what;
    EXPECT_NEAR(planned(p, "data", "all_gather"), double(m.sent("data", comm::OpKind::AllGather)),
                kMetricBytes)
        << what;
  }
}

// The MoE GPT in the megatron layout on ("model"=2), its experts whole along the axis or
// split over it (expert tensor parallelism): the state exactly, and the activations' all-
// reduces over "model" (the experts' psum and its transpose with the split; none for whole
// experts, whose layer reduces only its attention's); split beside sequence parallelism with
// a shared expert: the state, and the scatters of the sequence (the MoE layers gather and
// scatter theirs).
TEST(Plan, GptMoeTensorParallelMatchesTheRun) {
  const GptSizes z;
  for (const auto& [split, sp] :
       {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    models::TransformerConfig c = gpt_of(z);
    c.tp = {.layout = parallel::TPLayout::Megatron, .sequence_parallel = sp};
    c.moe_every = 1;
    // With sequence parallelism too, a shared expert split beside the experts.
    c.moe = {.num_experts = 8,
             .top_k = 2,
             .hidden = 256,
             .shared_experts = sp ? 1 : 0,
             .tensor_axis = split ? "model" : ""};
    const Measured m = run_gpt_on(Mesh({1, 2}, {"data", "model"}), c, "data", z,
                                  [](DeviceContext&, const train::Batch& b) { return b; });
    plan::Setup s;
    s.tensor = 2;
    s.sequence_parallel = sp;
    s.global_batch = z.batch;
    s.seq_len = z.seq;
    const MoEShape moe{.experts = 8,
                       .top_k = 2,
                       .hidden = 256,
                       .shared_hidden = sp ? 256 : 0,
                       .tensor_parallel = split};
    const Plan p =
        make_plan(describe_gpt(256, z.d_model, z.layers, z.heads, z.seq, false, true, moe), s);
    const std::string what = std::string("MoE GPT model=2") + (split ? ", experts split" : "") +
                             (sp ? ", sequence parallel, shared expert" : "");
    EXPECT_EQ(p.parameters, double(m.mem.parameters)) << what;
    EXPECT_EQ(p.optimizer_state, double(m.mem.optimizer_state)) << what;
    if (!sp) {
      EXPECT_EQ(planned(p, "model", "all_reduce"), double(m.sent("model", comm::OpKind::AllReduce)))
          << what;
    } else {
      // The layers' gathers and scatters of the sequence, the MoE layers' among them (the
      // plan leaves out, under sequence parallelism, the replicated parameters' gradient
      // sums over "model" and the head's gather: docs/plan.md).
      EXPECT_EQ(planned(p, "model", "reduce_scatter"),
                double(m.sent("model", comm::OpKind::ReduceScatter)))
          << what;
      EXPECT_LE(planned(p, "model", "all_gather"), double(m.sent("model", comm::OpKind::AllGather)))
          << what;
    }
    EXPECT_GE(p.activations, double(m.mem.activations_peak)) << what;
  }
}

// ------------------------------------------------------------ the analytic descriptions

TEST(Plan, DescriptionsCountTheModelsOwnParameters) {
  const ModelDescription gpt = describe_gpt(256, 64, 3, 4, 32);
  const TensorTree params =
      models::Transformer(
          {.vocab = 256, .d_model = 64, .num_layers = 3, .num_heads = 4, .max_len = 32})
          .init(Key::from_seed(0));
  ASSERT_EQ(gpt.params.size(), params.size());
  for (const ParamInfo& p : gpt.params) {
    ASSERT_TRUE(params.contains(p.path)) << p.path;
    EXPECT_EQ(params.at(p.path).shape(), Shape(p.shape.begin(), p.shape.end())) << p.path;
  }
  // With MoE layers in every second block (SwiGLU experts, a shared MLP, the balancing bias).
  const MoEShape moe{.experts = 4, .top_k = 2, .hidden = 48, .every = 2, .swiglu = true,
                     .shared_hidden = 48, .bias = true};
  const ModelDescription gpt_moe = describe_gpt(256, 64, 4, 4, 32, false, true, moe);
  models::TransformerConfig mc{.vocab = 256, .d_model = 64, .num_layers = 4, .num_heads = 4,
                               .max_len = 32};
  mc.moe_every = 2;
  mc.moe = {.num_experts = 4, .top_k = 2, .hidden = 48, .swiglu = true, .shared_experts = 1,
            .balance_bias_rate = 0.01};
  const TensorTree moe_params = models::Transformer(mc).init(Key::from_seed(0));
  ASSERT_EQ(gpt_moe.params.size(), moe_params.size());
  for (const ParamInfo& p : gpt_moe.params) {
    ASSERT_TRUE(moe_params.contains(p.path)) << p.path;
    EXPECT_EQ(moe_params.at(p.path).shape(), Shape(p.shape.begin(), p.shape.end())) << p.path;
  }
  EXPECT_EQ(gpt_moe.moe_layers(), 2);
  const ModelDescription cls = describe_classifier(784, 512, 10);
  EXPECT_EQ(cls.num_params(), models::Classifier({.hidden = 512}).num_params());
}

// ------------------------------------------------------------ GPT-3 175B (docs/plan.md)

plan::Setup gpt3_setup() {
  plan::Setup s;
  s.data = 2;
  s.tensor = 8;
  s.pipe = 4;
  s.sequence_parallel = true;
  s.recompute = Recompute::Selective;
  s.microbatches = 16;
  s.global_batch = 32;
  s.seq_len = 2048;
  s.param_bytes = s.grad_bytes = s.activation_bytes = 2;
  s.activations = activation_model_megatron();
  return s;
}

TEST(Plan, Gpt3OnSixtyFourDevicesAsInTheGuide) {
  const ModelDescription gpt3 = describe_gpt(50257, 12288, 96, 96, 2048, true);
  EXPECT_NEAR(double(gpt3.num_params()), 174.6e9, 0.1e9);
  // The guide: 175B / 8 = 22B parameters per device under 8-way model parallelism,
  // 44 GB in fp16.
  plan::Setup tp8 = gpt3_setup();
  tp8.data = 8;
  tp8.pipe = 1;
  const Plan flat = make_plan(gpt3, tp8);
  EXPECT_NEAR(flat.params_per_device / 1e9, 21.9, 0.1);
  EXPECT_NEAR(flat.parameters / 1e9, 43.7, 0.2);
  // "11 GB with optimizations": the same mesh of 64 with 4 pipeline stages (data=2,
  // model=8, pipe=4); gradients as parameters, Adam's two 16-bit moments 2x (the guide's
  // accounting: --state-bytes 2 --no-master-weights), activations of 1F1B micro-batches of
  // one sequence under sequence parallelism and selective recomputation.
  plan::Setup guide = gpt3_setup();
  guide.state_bytes = 2;
  const Plan p = make_plan(gpt3, guide);
  EXPECT_NEAR(p.parameters / 1e9, 11.08, 0.01);
  EXPECT_NEAR(p.gradients / 1e9, 11.08, 0.01);
  EXPECT_NEAR(p.optimizer_state / 1e9, 22.16, 0.01);
  // 24 layers x 4 micro-batches in flight x 34 s b h / t bytes, plus one layer rebuilt.
  EXPECT_NEAR(p.activations / 1e9, 10.63, 0.01);
  EXPECT_NEAR(p.total() / 1e9, 54.95, 0.01);
  EXPECT_LT(p.total(), 80e9);  // "fits on 80GB A100"
  // Mixed precision as the ZeRO paper counts it (f32 master and moments: 12 bytes per
  // parameter) does not fit without sharding the optimizer state; ZeRO-1 does.
  plan::Setup mixed = gpt3_setup();
  mixed.master_weights = true;
  EXPECT_GT(make_plan(gpt3, mixed).total(), 80e9);
  mixed.zero_stage = 1;
  EXPECT_LT(make_plan(gpt3, mixed).total(), 80e9);
  const config::ProgramCapabilities everything{
      .tensor_parallel = true,
      .pipeline_parallel = true,
      .shards = {config::Shard::None, config::Shard::Optimizer, config::Shard::Gradients,
                 config::Shard::Parameters},
      .mixed_precision = true};
  const std::vector<Plan> fits = meshes_that_fit(gpt3, guide, 64, 80.0 * (1 << 30), everything);
  ASSERT_FALSE(fits.empty());
  for (std::size_t i = 1; i < fits.size(); ++i)
    EXPECT_LE(fits[i - 1].total(), fits[i].total());
  for (const Plan& f : fits)
    EXPECT_EQ(f.setup.world(), 64);
}

TEST(Plan, PipelineActivationsFollowTheMicroBatchesInFlight) {
  // The first stage holds min(m, p) micro-batches under 1F1B, m under GPipe and
  // p + (p-1)/v under the interleaved schedules (Megatron's figure; pipeline_schedule_test
  // checks the schedules' own peaks): with p = 4, m = 16, v = 2 that is 4, 16 and 5.5.
  // Zero-bubble holds each until its W: as 1F1B. (Without recomputation, whose rebuilt
  // layer exists during a backward only, the peak is the end of a forward.)
  const ModelDescription gpt3 = describe_gpt(50257, 12288, 96, 96, 2048, true);
  auto activations = [&](PipeSchedule schedule, int v, std::int64_t m) {
    plan::Setup s = gpt3_setup();
    s.recompute = Recompute::None;
    s.schedule = schedule;
    s.virtual_stages = v;
    s.microbatches = m;
    s.global_batch = m * s.data;
    return make_plan(gpt3, s).activations;
  };
  const double one = activations(PipeSchedule::OneFOneB, 1, 16);
  EXPECT_NEAR(activations(PipeSchedule::Interleaved, 2, 16) / one, 5.5 / 4, 1e-9);
  EXPECT_NEAR(activations(PipeSchedule::ZeroBubble, 1, 16), one, 1e-6 * one);
  // GPipe: 16 on every stage; the last one, with the head's logits besides, is reported.
  EXPECT_GT(activations(PipeSchedule::GPipe, 1, 16), 4 * one);
  // m = p: every chunk of every micro-batch, m v chunks of 1/v: as 1F1B.
  EXPECT_NEAR(activations(PipeSchedule::Interleaved, 2, 4),
              activations(PipeSchedule::OneFOneB, 1, 4), 1e-6 * one);
}

TEST(Plan, CommunicationFollowsTheRingFormulas) {
  plan::Setup s;
  s.data = 8;
  s.global_batch = 64;
  const ModelDescription m = describe_classifier(784, 512, 10);
  const double g = 4.0 * double(m.num_params());
  EXPECT_DOUBLE_EQ(planned(make_plan(m, s), "data", "all_reduce"), 2.0 * 7 / 8 * g);
  s.zero_stage = 1;  // reduce-scatter + all-gather: the same total
  EXPECT_DOUBLE_EQ(make_plan(m, s).comm_bytes(), 2.0 * 7 / 8 * g);
}

TEST(Plan, StateFollowsTheZeroPaper) {
  // f32 AdamW, bytes per parameter: DP 16, ZeRO-1 8 + 8/N, ZeRO-2 4 + 12/N, ZeRO-3 16/N
  // (every leaf of this classifier is large enough to be fully sharded at 2^10).
  const ModelDescription m = describe_classifier(1024, 1024, 16);
  const double p = double(m.num_params()) - 1024 - 16;  // the biases stay replicated
  for (int n : {2, 4, 8}) {
    plan::Setup s;
    s.data = n;
    s.global_batch = 8 * n;
    s.fsdp_min_weight_size = 1024 * 16;
    auto state = [&](int zero, bool fsdp) {
      s.zero_stage = zero;
      s.fsdp = fsdp;
      const Plan pl = make_plan(m, s);
      return pl.parameters + pl.gradients + pl.optimizer_state;
    };
    const double all = double(m.num_params());
    EXPECT_DOUBLE_EQ(state(0, false), 16 * all);
    EXPECT_DOUBLE_EQ(state(1, false), 8 * all + 8 * all / n);
    EXPECT_DOUBLE_EQ(state(2, false), 4 * all + 12 * all / n);
    EXPECT_DOUBLE_EQ(state(0, true), 16 * p / n + 16 * (all - p));
  }
}

TEST(Plan, BadMeshesAreClearErrors) {
  plan::Setup s;
  s.tensor = 3;
  s.global_batch = 8;
  s.seq_len = 8;
  EXPECT_THROW(make_plan(describe_gpt(256, 64, 2, 4, 8), s), InvalidArgument);
  s.tensor = 1;
  s.data = 3;
  EXPECT_THROW(make_plan(describe_gpt(256, 64, 2, 4, 8), s), InvalidArgument);
}

}  // namespace
}  // namespace distjax::plan
