// Pipeline parallelism against one device: every schedule, PP x DP x TP on (2,2,2) and
// PP x FSDP give the same losses and final parameters as the whole model trained on one
// device over 5 AdamW steps; activation memory per stage follows the schedule (1F1B holds
// at most p micro-batches, GPipe m), measured by the memory accounting; bad counts fail
// with clear errors.
#include "distjax/parallel/pipeline.hpp"
#include "distjax/tensor/shape_ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/data/documents.hpp"
#include "distjax/models/pp_classifier.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/train/train_step.hpp"
#include "parallel/parity_util.hpp"

using namespace distjax;
using namespace distjax::parallel;
using distjax::testing::expect_same_run;
using distjax::testing::TrainingRun;
using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

constexpr int kSteps = 5;
// As in zero_test.cpp: AdamW divides by sqrt(v) + eps, so an element whose gradient is
// near zero moves by up to ~lr when its sum order differs in the last bits; eps = 1e-4
// and 2e-5 x max |value| bound it (micro-batches sum the gradient in another order).
constexpr double kAdamTol = 2e-5;
// The GPT's position table starts at N(0, 0.01), so its tolerance (relative to its own max
// |value|, ~0.06 after 5 steps of lr 1e-2) is tight: near-zero position gradients, which
// micro-batches and data shards sum in another order, move by different fractions of lr
// under AdamW; measured 5.8e-5 x max |value| on "wpe/embedding", every other tensor under
// 2e-5. The SGD run of the same test agrees to 1e-5 on every tensor.
constexpr double kGptAdamTol = 1e-4;

const optim::AdamW& adamw() {
  static const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2),
                                 .eps = 1e-4,
                                 .weight_decay = 1e-2,
                                 .decay_mask = optim::default_decay_mask()});
  return opt;
}

std::vector<train::Batch> image_batches(int steps, std::int64_t batch, std::int64_t features) {
  std::vector<train::Batch> out;
  for (int s = 0; s < steps; ++s) {
    const Key k = Key::from_seed(7).fold_in(static_cast<std::uint64_t>(s));
    std::vector<float> x(batch * features);
    std::vector<std::int32_t> y(batch);
    for (std::int64_t i = 0; i < batch * features; ++i)
      x[i] = static_cast<float>(k.bits(static_cast<std::uint64_t>(i))[0] % 1000) / 500.f - 1.f;
    for (std::int64_t i = 0; i < batch; ++i)
      y[i] = static_cast<std::int32_t>(k.bits(1u << 20 | i)[1] % 10);
    out.push_back({Tensor::from_vector(x, {batch, features}), Tensor::from_vector(y, {batch})});
  }
  return out;
}

TrainingRun train_reference(const TensorTree& init, const train::LossFn& fn,
                            const std::vector<train::Batch>& batches,
                            const optim::Optimizer& opt = adamw(), int num_minibatches = 1) {
  auto state = train::TrainState::create(init, opt, Key::from_seed(2));
  TrainingRun run;
  for (const auto& b : batches) {
    const train::Metrics m =
        train::train_step(state, b, fn, opt,
                          {.num_minibatches = num_minibatches,
                           .max_grad_norm = distjax::testing::kParityMaxGradNorm});
    run.losses.push_back(m.mean("loss"));
    run.grad_norms.push_back(m.mean("grad_norm"));
  }
  run.params = state.params;
  return run;
}

// How a pipelined run is set up on each device.
struct PipeSetup {
  PipelineOptions options;
  const nn::FullySharded* fsdp = nullptr;
  // The strategy of the other axes: data parallel over "data" when the mesh has it (ZeRO
  // of this stage when > 0), else tensor parallel over "model" when it has that, else none.
  int zero_stage = 0;
  // The train step's loss function: the pipeline's module_loss() (as app::train composes
  // it), else null (the module's last chunk itself).
  bool module_loss = false;
  // With a "context" axis: each device's share of the sequences (its batch sharded so), and
  // the gradients averaged over "data" (when there is one) and "context" together.
  parallel::ContextLayout context{};
};

// Places a device's shard into the global array `g` (allocated on first use).
struct Gathered {
  std::mutex mu;
  std::map<std::string, Tensor> global;
  void put(const std::string& path, const Tensor& local, const mesh::PartitionSpec& spec,
           DeviceContext& ctx) {
    Shape gshape = local.shape();
    std::vector<std::int64_t> offset(local.shape().size(), 0);
    for (int d = 0; d < static_cast<int>(gshape.size()); ++d) {
      const auto axes = spec.entry(d).axes;
      if (axes.empty()) continue;
      const mesh::Axes a(axes);
      offset[d] = ctx.axis_index(a) * local.size(d);
      gshape[d] *= ctx.axis_size(a);
    }
    std::lock_guard<std::mutex> lock(mu);
    Tensor& g = global[path];
    if (!g.defined()) g = Tensor::zeros(gshape, DType::F32, local.device());
    tensor::copy_to_box(g, offset, local);
  }
};

TrainingRun train_pipelined(const Mesh& mesh, const PipelineModule& module, const PipeSetup& setup,
                            const std::vector<train::Batch>& batches,
                            const optim::Optimizer& opt = adamw(), int num_minibatches = 1) {
  const bool has_data = mesh.has_axis("data");
  const int n_data = has_data ? mesh.axis_size("data") : 1;
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(mesh.size()));
  std::vector<double> norms;
  Gathered out;
  spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const int p = ctx.axis_size("pipe"), v = setup.options.virtual_stages;
        std::vector<int> chunks;
        for (int k = 0; k < v; ++k)
          chunks.push_back(k * p + ctx.axis_index("pipe"));
        nn::ParamSpecs specs;
        TensorTree params = module.init(Key::from_seed(1), chunks, p * v, &specs, &ctx, setup.fsdp);
        std::unique_ptr<train::Strategy> inner;
        const bool split = mesh.has_axis("context");
        if (split)
          inner = std::make_unique<DataParallel>(
              ctx, has_data ? mesh::Axes({"data", "context"}) : mesh::Axes("context"), &specs);
        else if (has_data && setup.zero_stage > 0)
          inner = std::make_unique<ZeroDataParallel>(ctx, setup.zero_stage, "data", &specs);
        else if (has_data)
          inner = std::make_unique<DataParallel>(
              ctx, "data", &specs,
              DataParallelOptions{.fully_sharded =
                                      setup.fsdp ? mesh::Axes(setup.fsdp->axis) : mesh::Axes()});
        else if (mesh.has_axis("model"))
          inner = std::make_unique<TensorParallel>(ctx, "model");
        PipelineOptions options = setup.options;
        options.fsdp = setup.fsdp;
        Pipeline pp(ctx, module, options, inner.get());
        EXPECT_EQ(pp.chunks(), chunks);
        auto state = train::TrainState::create(params, opt, Key::from_seed(2), pp);
        const int i = has_data ? ctx.axis_index("data") : 0;
        for (const auto& b : batches) {
          const std::int64_t per = b.size() / n_data;
          train::Batch local = b.slice(i * per, (i + 1) * per);
          if (split)
            local = local.map([&](const Tensor& t) {
              return setup.context.shard(t, 1, ctx.axis_index("context"));
            });
          const train::Metrics m =
              train::train_step(state, local,
                                setup.module_loss ? pp.module_loss() : nullptr, opt,
                                {.num_minibatches = num_minibatches,
                                 .max_grad_norm = distjax::testing::kParityMaxGradNorm,
                                 .strategy = &pp});
          losses[static_cast<std::size_t>(ctx.device())].push_back(m.mean("loss"));
          if (ctx.device() == 0) norms.push_back(m.mean("grad_norm"));
        }
        for (const auto& [path, t] : state.params)
          out.put(path, t, specs.count(path) ? specs.at(path) : mesh::PartitionSpec(), ctx);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  TrainingRun run{losses[0], norms, {}};
  for (const auto& [path, g] : out.global)
    run.params.set(path, g);
  for (std::size_t d = 1; d < losses.size(); ++d)
    EXPECT_EQ(losses[d], losses[0]) << "device " << d;
  return run;
}

models::PPClassifierConfig classifier_config(int layers) {
  return {
      .in_features = 12, .hidden = 16, .num_layers = layers, .mlp_expansion = 2, .num_classes = 10};
}

models::TransformerConfig gpt_config(models::TransformerTP tp = {}) {
  return {.vocab = 32,
          .d_model = 16,
          .num_layers = 4,
          .num_heads = 4,
          .mlp_ratio = 2,
          .max_len = 8,
          .tied_embeddings = false,
          .tp = tp};
}

}  // namespace

TEST(Pipeline, EveryScheduleMatchesOneDevice) {
  const models::PPClassifier model(classifier_config(8));
  const auto data = image_batches(kSteps, 16, 12);
  const TrainingRun one = train_reference(model.init(Key::from_seed(1)), model.loss_fn(), data);
  struct Case {
    ScheduleKind kind;
    int p, m, v;
  };
  for (const Case& c :
       {Case{ScheduleKind::GPipe, 4, 8, 1}, Case{ScheduleKind::OneFOneB, 4, 8, 1},
        Case{ScheduleKind::OneFOneB, 2, 4, 1}, Case{ScheduleKind::Interleaved1F1B, 2, 4, 2},
        Case{ScheduleKind::Interleaved1F1B, 4, 4, 2}, Case{ScheduleKind::ZeroBubbleH1, 4, 8, 1},
        Case{ScheduleKind::InterleavedZeroBubble, 2, 4, 2},
        Case{ScheduleKind::InterleavedZeroBubble, 4, 8, 2}}) {
    const std::string what = to_string(c.kind) + " p=" + std::to_string(c.p) +
                             " m=" + std::to_string(c.m) + " v=" + std::to_string(c.v);
    const TrainingRun run = train_pipelined(
        Mesh({c.p}, {"pipe"}), model,
        {.options = {.schedule = c.kind, .microbatches = c.m, .virtual_stages = c.v}}, data);
    expect_same_run(one, run, kAdamTol, what);
  }
}

TEST(Pipeline, GradientAccumulationAroundThePipelineMatchesOneDevice) {
  // Two accumulation slices per step, each run as 4 micro-batches through the pipeline.
  const models::PPClassifier model(classifier_config(4));
  const auto data = image_batches(kSteps, 16, 12);
  const TrainingRun one =
      train_reference(model.init(Key::from_seed(1)), model.loss_fn(), data, adamw(), 2);
  const TrainingRun run = train_pipelined(
      Mesh({2}, {"pipe"}), model,
      {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 4}}, data, adamw(), 2);
  expect_same_run(one, run, kAdamTol, "1F1B with 2 accumulation slices");
}

TEST(Pipeline, ZeroOneInsideTheStagesMatchesOneDevice) {
  // ZeRO-1 over "data" inside each stage of a 1F1B pipeline over "pipe"; ZeRO-2, which
  // reduce-scatters inside its own forward_backward, is refused by the reason it gives.
  const models::PPClassifier model(classifier_config(4));
  const auto data = image_batches(kSteps, 16, 12);
  const TrainingRun one = train_reference(model.init(Key::from_seed(1)), model.loss_fn(), data);
  const TrainingRun run = train_pipelined(
      Mesh({2, 2}, {"data", "pipe"}), model,
      {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 4}, .zero_stage = 1}, data);
  expect_same_run(one, run, kAdamTol, "1F1B x ZeRO-1");
  spmd::shard_map(Mesh({2, 2}, {"data", "pipe"}),
                  [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                    ZeroDataParallel zero2(ctx, 2, "data");
                    try {
                      Pipeline pp(ctx, model, {}, &zero2);
                      ADD_FAILURE() << "a pipeline over ZeRO-2 was accepted";
                    } catch (const ConfigError& e) {
                      EXPECT_NE(std::string(e.what()).find("ZeRO-2 reduce-scatters inside its own "
                                                           "forward_backward"),
                                std::string::npos)
                          << e.what();
                    }
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
}

// f16 with dynamic loss scaling: a 2-stage 1F1B pipeline of 4 micro-batches, the train
// step's (scaled) loss function in the last chunk's place (Pipeline::module_loss()),
// against the same f16 computation on one device (the whole model as one chunk) over 8
// SGD steps. The first scale, 2^20, overflows the f16 cotangents of the matmuls: those
// steps are skipped on both alike, the scale halves until the gradients fit, then grows
// (every 2 good steps) until it overflows again. The scales and skipped steps are equal;
// losses agree, and every parameter to its tensor's max |value|, within f16's epsilon,
// 2^-10 relative. Why f16's and not f32's: the one device multiplies 16 rows where a stage
// multiplies 4, and a GEMM library may pick another kernel, so another summation order,
// for another row count; an f32 sum an ulp apart then rounds to another f16 now and then,
// and later steps carry that. Measured: 2e-7 on an AVX-512 CPU (oneDNN's kernels there
// gave each row the same bits whatever the row count) and on an H100; 1.2e-4 on an AVX2
// CPU (Zen 2/3), whose oneDNN sgemm does not.
TEST(Pipeline, Fp16WithDynamicLossScalingMatchesOneDevice) {
  const models::PPClassifier model(classifier_config(4));
  constexpr int kF16Steps = 8;
  const auto data = image_batches(kF16Steps, 16, 12);
  const nn::Precision f16 = nn::Precision::fp16();
  const train::DynamicLossScale scale0{.scale = std::ldexp(1.0, 20), .growth_interval = 2};
  const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1), .momentum = 0.9});
  struct Run {
    std::vector<double> losses, scales, skipped;
    TensorTree params;
  };
  auto record = [](Run& r, const train::Metrics& m) {
    r.losses.push_back(m.mean("loss"));
    r.scales.push_back(m.mean("loss_scale"));
    r.skipped.push_back(m.mean("skipped_steps"));
  };
  Run one;
  {
    auto state = train::TrainState::create(model.init(Key::from_seed(1)), opt, Key::from_seed(2));
    state.loss_scale = scale0;
    const train::LossFn whole = [&](const TensorTree& p, const train::Batch& b, Key k) {
      train::Metrics m;
      Tensor loss =
          model.forward(nn::Scope::apply(&p, true, k).with_precision(f16), 0, 1, Tensor(), b, m);
      return std::make_pair(loss, m);
    };
    for (const auto& b : data)
      record(one, train::train_step(state, b, whole, opt));
    one.params = state.params;
  }
  Run piped;
  std::mutex mu;
  spmd::shard_map(
      Mesh({2}, {"pipe"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        Pipeline pp(ctx, model,
                    {.schedule = ScheduleKind::OneFOneB, .microbatches = 4, .precision = f16});
        auto state =
            train::TrainState::create(model.init(Key::from_seed(1), pp.chunks(), pp.num_chunks()),
                                      opt, Key::from_seed(2), pp);
        state.loss_scale = scale0;
        Run mine;
        for (const auto& b : data)
          record(mine, train::train_step(state, b, pp.module_loss(), opt, {.strategy = &pp}));
        std::lock_guard<std::mutex> lock(mu);
        if (ctx.device() == 0) {
          piped.losses = mine.losses;
          piped.scales = mine.scales;
          piped.skipped = mine.skipped;
        }
        for (const auto& [path, t] : state.params)
          piped.params.set(path, t);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  EXPECT_EQ(piped.scales, one.scales);
  EXPECT_EQ(piped.skipped, one.skipped);
  ASSERT_GE(one.skipped.back(), 1) << "no step overflowed: the test shows no skip";
  ASSERT_LT(one.skipped.back(), kF16Steps) << "every step overflowed";
  const double tol = std::ldexp(1.0, -10);  // f16's epsilon
  for (int s = 0; s < kF16Steps; ++s)
    EXPECT_NEAR(piped.losses[s], one.losses[s], tol * std::abs(one.losses[s])) << "step " << s;
  ASSERT_EQ(piped.params.size(), one.params.size());
  double worst = 0;
  for (const auto& [path, t] : one.params) {
    const auto a = t.to_vector<float>(), b = piped.params.at(path).to_vector<float>();
    double max_abs = 0, max_diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(a[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    }
    worst = std::max(worst, max_diff / max_abs);
    EXPECT_LE(max_diff, tol * max_abs) << path;
  }
  std::printf("fp16 pipeline vs one device: scales");
  for (double x : one.scales)
    std::printf(" %g", x);
  std::printf("; worst parameter difference %.2g x max |value|\n", worst);
}

TEST(Pipeline, GptDataTensorPipe222MatchesOneDevice) {
  const auto data = distjax::testing::random_token_batches(kSteps, 8, 8, 32, 3);
  const models::TransformerPipeline whole(gpt_config());
  const TrainingRun one =
      train_reference(whole.init(Key::from_seed(1), {0}, 1), whole.loss_fn(), data);
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1}) {
    const models::TransformerPipeline tp(gpt_config({.layout = TPLayout::Megatron}));
    const TrainingRun run =
        train_pipelined(Mesh({2, 2, 2}, {"data", "model", "pipe"}), tp,
                        {.options = {.schedule = kind, .microbatches = 2}}, data);
    expect_same_run(one, run, kGptAdamTol, "PP x DP x TP, " + to_string(kind));
  }
  // With SGD, which moves each parameter in proportion to its gradient, the runs agree to
  // 1e-5: the gradients are the same; only AdamW's normalisation amplifies their last bits.
  const optim::SGD sgd({.learning_rate = optim::constant_schedule(0.1)});
  const TrainingRun one_sgd =
      train_reference(whole.init(Key::from_seed(1), {0}, 1), whole.loss_fn(), data, sgd);
  const models::TransformerPipeline tp(gpt_config({.layout = TPLayout::Megatron}));
  const TrainingRun run_sgd = train_pipelined(
      Mesh({2, 2, 2}, {"data", "model", "pipe"}), tp,
      {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 2}}, data, sgd);
  expect_same_run(one_sgd, run_sgd, 1e-5, "PP x DP x TP, SGD");
}

// The GPT's sequences split over a "context" axis (ring attention, balanced) beside a pipe
// and a data axis, 1F1B: the one-device run with SGD (gradients: each step moves a parameter
// by lr times it), losses and gradient norms to 1e-6 relative, parameters to 4e-6 of each
// tensor's max and 2e-6 in norm (||diff|| / ||value|| per tensor): the biases, which start
// at 0 and are sums of cancelling gradient means, measured 1.6e-6 of their max and 1.3e-6 in
// norm at worst on this small GPT (d 16, T 8; the SGD run of data x tensor x pipe above:
// 9e-7 of the max), every matrix under 1e-6.
TEST(Pipeline, GptContextAndPipeMatchOneDevice) {
  const auto data = distjax::testing::random_token_batches(kSteps, 8, 8, 32, 3);
  const optim::SGD sgd({.learning_rate = optim::constant_schedule(0.1)});
  const models::TransformerPipeline whole(gpt_config());
  const TrainingRun one =
      train_reference(whole.init(Key::from_seed(1), {0}, 1), whole.loss_fn(), data, sgd);
  for (const Mesh& mesh :
       {Mesh({2, 2}, {"context", "pipe"}), Mesh({2, 2, 2}, {"data", "context", "pipe"})}) {
    models::TransformerConfig c = gpt_config();
    c.cp = {.layout = {.size = 2}};
    const models::TransformerPipeline split(c);
    const TrainingRun run = train_pipelined(
        mesh, split,
        {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 2},
         .context = c.cp.layout},
        data, sgd);
    expect_same_run(one, run, 4e-6, "context x pipe on " + mesh.describe());
    distjax::testing::expect_params_within_norm(one, run, 2e-6,
                                                "context x pipe on " + mesh.describe());
    for (std::size_t s = 0; s < one.losses.size(); ++s)
      EXPECT_NEAR(run.losses[s], one.losses[s], 1e-6 * one.losses[s]) << s;
  }
}

// Packed documents (data::pack_documents, document attention) through data x tensor x pipe:
// every stage's attention keeps to the documents and the last stage's loss drops the eot
// positions, through the module's last chunk and through the train step's loss function.
TEST(Pipeline, GptPackedDocumentsDataTensorPipe222MatchOneDevice) {
  std::vector<train::Batch> batches;
  for (const train::Batch& b : distjax::testing::random_token_batches(kSteps, 8, 8, 4, 5))
    batches.push_back(data::pack_documents(b, 1));  // ids 0..3: the eot (1) ends many documents
  models::TransformerConfig config = gpt_config({.layout = TPLayout::Megatron});
  config.vocab = 4;
  config.document_attention = true;
  models::TransformerConfig whole_config = config;
  whole_config.tp = {};
  const models::TransformerPipeline whole(whole_config);
  const TrainingRun one =
      train_reference(whole.init(Key::from_seed(1), {0}, 1), whole.loss_fn(), batches);
  // The mask changes the run: without it the parity below would prove nothing.
  whole_config.document_attention = false;
  const models::TransformerPipeline unmasked(whole_config);
  EXPECT_NE(train_reference(unmasked.init(Key::from_seed(1), {0}, 1), unmasked.loss_fn(), batches)
                .losses,
            one.losses);
  const models::TransformerPipeline tp(config);
  for (bool module_loss : {false, true})
    expect_same_run(one,
                    train_pipelined(Mesh({2, 2, 2}, {"data", "model", "pipe"}), tp,
                                    {.options = {.schedule = ScheduleKind::OneFOneB,
                                                 .microbatches = 2},
                                     .module_loss = module_loss},
                                    batches),
                    kGptAdamTol, module_loss ? "documents, PP x DP x TP, module_loss" : "documents, PP x DP x TP");
}

// A Vision Transformer (the Transformer as an encoder of vectors into classes: causal =
// false, input_features, num_classes) over data x Megatron tensor (with sequence
// parallelism) x pipe, as the whole model on one device.
TEST(Pipeline, VitDataTensorPipe222MatchesOneDevice) {
  const auto flat = image_batches(kSteps, 8, 4 * 6);  // 4 patches of 6 values per image
  std::vector<train::Batch> data;
  for (const train::Batch& b : flat)
    data.push_back({tensor::reshape(b.inputs, {8, 4, 6}), b.labels});
  const auto vit = [](models::TransformerTP tp) {
    return models::TransformerConfig{.d_model = 16,
                                     .num_layers = 4,
                                     .num_heads = 4,
                                     .mlp_ratio = 2,
                                     .max_len = 4,
                                     .tied_embeddings = false,
                                     .tp = tp,
                                     .causal = false,
                                     .input_features = 6,
                                     .num_classes = 10};
  };
  const models::TransformerPipeline whole(vit({}));
  const TrainingRun one =
      train_reference(whole.init(Key::from_seed(1), {0}, 1), whole.loss_fn(), data);
  for (bool sp : {false, true}) {
    const models::TransformerPipeline tp(
        vit({.layout = TPLayout::Megatron, .sequence_parallel = sp}));
    const TrainingRun run =
        train_pipelined(Mesh({2, 2, 2}, {"data", "model", "pipe"}), tp,
                        {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 2}}, data);
    expect_same_run(one, run, kGptAdamTol, sp ? "ViT PP x DP x TP+SP" : "ViT PP x DP x TP");
  }
  // Not causal: a block's output at the first position depends on the last patch.
  const models::Transformer encoder(vit({}));
  const TensorTree params = encoder.init(Key::from_seed(1));
  const nn::Scope scope = nn::Scope::apply(&params, false, Key());
  std::vector<float> v = data[0].inputs.to_vector<float>();
  const auto first_position = [&](const std::vector<float>& in) {
    const Tensor y =
        encoder.block(scope, 0, encoder.embed(scope, Tensor::from_vector(in, {8, 4, 6})));
    return y.to_vector<float>()[0];  // image 0, position 0, feature 0
  };
  const float before = first_position(v);
  v[3 * 6] += 1.f;  // image 0, last patch
  EXPECT_NE(first_position(v), before);
  EXPECT_EQ(encoder.apply(params, data[0].inputs, false, Key()).shape(), (Shape{8, 10}));
  EXPECT_EQ(encoder.num_params(), params.num_elements());
}

// SGD with momentum (its state sharded with the parameters), every parameter within 1e-5 x
// its tensor's max |value|. Under AdamW the token and position tables' near-zero gradients,
// summed in another order, move by different fractions of lr: measured 3.8e-6 on the CPU but
// 1.2e-4 ("wte/embedding") on an H200, whose GEMMs sum in yet other orders, with every loss
// and gradient norm within 2e-5. PP with AdamW is checked by the tests above, FSDP with AdamW
// by fsdp_test.
TEST(Pipeline, FullyShardedStagesMatchOneDevice) {
  const auto data = distjax::testing::random_token_batches(kSteps, 8, 8, 32, 4);
  const models::TransformerPipeline gpt(gpt_config());
  const optim::SGD sgd({.learning_rate = optim::constant_schedule(0.1), .momentum = 0.9});
  const TrainingRun one =
      train_reference(gpt.init(Key::from_seed(1), {0}, 1), gpt.loss_fn(), data, sgd);
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = 64};
  const TrainingRun run = train_pipelined(
      Mesh({2, 2}, {"data", "pipe"}), gpt,
      {.options = {.schedule = ScheduleKind::OneFOneB, .microbatches = 2}, .fsdp = &fsdp}, data,
      sgd);
  expect_same_run(one, run, 1e-5, "PP x FSDP");
}

TEST(Pipeline, ActivationMemoryFollowsTheSchedule) {
  // Wide activations, few parameters: a micro-batch's activations dominate what a stage
  // holds, so the memory accounting shows how many are in flight.
  const models::PPClassifier model(
      {.in_features = 8, .hidden = 64, .num_layers = 2, .mlp_expansion = 4, .num_classes = 4});
  const int p = 2, m = 8;
  const std::int64_t b = 64;                                 // per micro-batch
  std::map<std::pair<std::string, int>, std::int64_t> peak;  // (run, stage) -> bytes
  std::map<std::pair<std::string, int>, int> in_flight;
  std::int64_t one_mb = 0;  // activation bytes of one micro-batch on stage 0
  std::mutex mu;
  struct Run {
    std::string name;
    ScheduleKind kind;
    int m;
  };
  for (const Run& r :
       {Run{"gpipe8", ScheduleKind::GPipe, 8}, Run{"gpipe4", ScheduleKind::GPipe, 4},
        Run{"1f1b8", ScheduleKind::OneFOneB, 8}, Run{"1f1b4", ScheduleKind::OneFOneB, 4},
        Run{"one", ScheduleKind::GPipe, 1}}) {
    train::Batch batch = image_batches(1, b * r.m, 8)[0];
    std::vector<std::int32_t> labels = batch.labels.to_vector<std::int32_t>();
    for (std::int32_t& y : labels)
      y %= 4;
    batch.labels = Tensor::from_vector(labels, batch.labels.shape());
    spmd::shard_map(Mesh({p}, {"pipe"}),
                    [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                      Pipeline pp(ctx, model, {.schedule = r.kind, .microbatches = r.m});
                      TensorTree params = model.init(Key::from_seed(1), pp.chunks(),
                                                     pp.num_chunks(), nullptr, &ctx);
                      auto state =
                          train::TrainState::create(params, adamw(), Key::from_seed(2), pp);
                      train::train_step(state, batch, nullptr, adamw(), {.strategy = &pp});
                      std::lock_guard<std::mutex> lock(mu);
                      peak[{r.name, pp.stage()}] = ctx.memory().activations_peak;
                      in_flight[{r.name, pp.stage()}] = pp.last_trace().peak_in_flight;
                      if (pp.stage() == 0 && r.name == "one") {
                        // One micro-batch forward on stage 0 with grad on: what it keeps alive.
                        const TensorTree leaves = autodiff::detail::make_leaves(state.params);
                        const std::int64_t before = tensor::live_bytes();
                        tensor::EnableGradGuard on;
                        train::Metrics unused;
                        Tensor y = model.forward(nn::Scope::apply(&leaves, true).on(ctx), 0, 2,
                                                 Tensor(), batch, unused);
                        one_mb = tensor::live_bytes() - before;
                      }
                      return std::vector<Tensor>{};
                    },
                    {}, {})(std::vector<Tensor>{});
  }
  ASSERT_GT(one_mb, 0);
  auto peak_of = [&](const std::string& run, int s) { return peak[std::make_pair(run, s)]; };
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(in_flight[std::make_pair(std::string("gpipe8"), s)], m) << "stage " << s;
    EXPECT_EQ(in_flight[std::make_pair(std::string("1f1b8"), s)], p - s) << "stage " << s;
  }
  // In micro-batches of stage 0's activations: GPipe's peak grows by one per extra
  // micro-batch (it holds all m), 1F1B's does not grow at all (it holds at most p),
  // whatever else the step holds at its peak (gradients, backward temporaries). 5% of a
  // micro-batch covers the transfer buffers.
  auto in_mb = [&](std::int64_t bytes) { return static_cast<double>(bytes) / one_mb; };
  EXPECT_NEAR(in_mb(peak_of("gpipe8", 0) - peak_of("gpipe4", 0)), 4.0, 0.05);
  EXPECT_NEAR(in_mb(peak_of("1f1b8", 0) - peak_of("1f1b4", 0)), 0.0, 0.05);
  EXPECT_GE(in_mb(peak_of("gpipe8", 0) - peak_of("one", 0)), (m - 1) - 0.05);
  EXPECT_LE(in_mb(peak_of("1f1b8", 0)), in_mb(peak_of("gpipe8", 0)) - (m - p - 1));
}

TEST(Pipeline, ZeroBubbleActivationMemoryStaysAtItsNonSplitSchedules) {
  // The zero-bubble schedules hold a micro-batch from its F to its W (W keeps the linear
  // layers' inputs and output cotangents, about what F keeps), and run a W before an F
  // where that would hold more than their non-split schedule holds on stage 0: ZB-H1
  // 1F1B's p micro-batches on every stage, interleaved zero bubble interleaved 1F1B's
  // peak. Read from the memory accounting, in micro-batches of a stage's activations
  // (what one more micro-batch adds under GPipe).
  const models::PPClassifier model(
      {.in_features = 8, .hidden = 64, .num_layers = 4, .mlp_expansion = 4, .num_classes = 4});
  const int p = 2;
  const std::int64_t b = 64;                                 // per micro-batch
  std::map<std::pair<std::string, int>, std::int64_t> peak;  // (run, stage) -> bytes
  std::mutex mu;
  struct Run {
    std::string name;
    ScheduleKind kind;
    int m, v;
  };
  for (const Run& r :
       {Run{"gpipe8", ScheduleKind::GPipe, 8, 1}, Run{"gpipe4", ScheduleKind::GPipe, 4, 1},
        Run{"1f1b8", ScheduleKind::OneFOneB, 8, 1}, Run{"zbh1_8", ScheduleKind::ZeroBubbleH1, 8, 1},
        Run{"zbh1_4", ScheduleKind::ZeroBubbleH1, 4, 1},
        Run{"inter8", ScheduleKind::Interleaved1F1B, 8, 2},
        Run{"izb8", ScheduleKind::InterleavedZeroBubble, 8, 2},
        Run{"izb4", ScheduleKind::InterleavedZeroBubble, 4, 2}}) {
    train::Batch batch = image_batches(1, b * r.m, 8)[0];
    std::vector<std::int32_t> labels = batch.labels.to_vector<std::int32_t>();
    for (std::int32_t& y : labels)
      y %= 4;
    batch.labels = Tensor::from_vector(labels, batch.labels.shape());
    spmd::shard_map(
        Mesh({p}, {"pipe"}),
        [&](DeviceContext& ctx, const std::vector<Tensor>&) {
          Pipeline pp(ctx, model, {.schedule = r.kind, .microbatches = r.m, .virtual_stages = r.v});
          TensorTree params =
              model.init(Key::from_seed(1), pp.chunks(), pp.num_chunks(), nullptr, &ctx);
          auto state = train::TrainState::create(params, adamw(), Key::from_seed(2), pp);
          train::train_step(state, batch, nullptr, adamw(), {.strategy = &pp});
          std::lock_guard<std::mutex> lock(mu);
          peak[{r.name, pp.stage()}] = ctx.memory().activations_peak;
          return std::vector<Tensor>{};
        },
        {}, {})(std::vector<Tensor>{});
  }
  auto at = [&](const std::string& run, int s) { return static_cast<double>(peak[{run, s}]); };
  const double mb = (at("gpipe8", 0) - at("gpipe4", 0)) / 4;
  ASSERT_GT(mb, 0);
  // A W computes a weight's cotangent before adding it to the sum: one weight-sized
  // temporary (fc1's kernel, 64 x 256 f32, the largest; 0.19 micro-batches here) beyond
  // what the non-split schedule holds.
  const double w_temp = 64.0 * 256 * 4;
  // Not growing with m, unlike GPipe's (which holds them all: 4 micro-batches more).
  EXPECT_LE(std::abs(at("zbh1_8", 0) - at("zbh1_4", 0)), w_temp);
  EXPECT_LE(std::abs(at("izb8", 0) - at("izb4", 0)), w_temp);
  // A deferred W also keeps its linear layer's input past the B that the non-split schedule
  // frees it at: at most the widest, fc2's (silu's output, 64 x 256 f32 per micro-batch).
  // (The non-split schedules free it at B since a unary op's backward keeps only what its
  // derivative reads: silu's reads its input, so its output no longer waits for it.)
  const double w_input = 64.0 * 256 * 4;
  // On every stage at most the non-split schedule's stage 0, the temporary and that input.
  for (int s = 0; s < p; ++s) {
    EXPECT_LE(at("zbh1_8", s), at("1f1b8", 0) + w_temp + w_input) << "stage " << s;
    EXPECT_LE(at("izb8", s), at("inter8", 0) + w_temp + w_input) << "stage " << s;
  }
}

TEST(Pipeline, CountsAreValidated) {
  const models::PPClassifier model(classifier_config(2));
  // More stages than layers.
  EXPECT_THROW(
      {
        try {
          model.init(Key::from_seed(1), {0}, 4);
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("more stages than layers"), std::string::npos);
          throw;
        }
      },
      ConfigError);
  // A batch the micro-batches do not divide.
  std::string error;
  std::mutex mu;
  spmd::shard_map(
      Mesh({2}, {"pipe"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        Pipeline pp(ctx, model, {.schedule = ScheduleKind::OneFOneB, .microbatches = 4});
        TensorTree params =
            model.init(Key::from_seed(1), pp.chunks(), pp.num_chunks(), nullptr, &ctx);
        auto state = train::TrainState::create(params, adamw(), Key::from_seed(2), pp);
        try {
          train::train_step(state, image_batches(1, 6, 12)[0], nullptr, adamw(), {.strategy = &pp});
        } catch (const InvalidArgument& e) {
          std::lock_guard<std::mutex> lock(mu);
          error = e.what();
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  EXPECT_NE(error.find("batch size 6 is not divisible by 4 micro-batches"), std::string::npos)
      << error;
  // Tied embeddings cannot be cut.
  models::TransformerConfig tied = gpt_config();
  tied.tied_embeddings = true;
  EXPECT_THROW(models::TransformerPipeline(tied).init(Key::from_seed(1), {0}, 2), ConfigError);
}
