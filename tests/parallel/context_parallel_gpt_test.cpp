// The GPT with its sequence split over a "context" axis, trained 5 steps against the same
// GPT on one device (the parity harness: losses, gradient norms and every parameter):
// context sizes 2, 4 and 8, ring attention balanced and plain, Ulysses, alone and with data
// parallelism, Megatron tensor parallelism (with sequence parallelism) and fully sharded
// parameters. SGD, so a parameter's change is its gradient times the learning rate.
#include <gtest/gtest.h>

#include <memory>

#include "distjax/models/transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "parallel/parity_util.hpp"

namespace distjax {
namespace {

using distjax::testing::ParityModel;
using distjax::testing::TrainingRun;
using parallel::ContextLayout;
using parallel::ContextMethod;
using parallel::ContextPlan;
using parallel::TPLayout;

// f32 sums of the same terms in other orders (blockwise attention, the ring's gradient
// order, gradients averaged over more devices) over 5 SGD steps: losses and gradient norms
// within 1e-6 relative. Parameters within kParamTol of each tensor's max |value|: the
// matrices agree to 3e-7, the biases (which start at 0, so after 5 steps are sums of
// cancelling gradient means) to 1.2e-6 at worst (measured: ln1's bias on dp=2 x cp=2).
constexpr double kTol = 1e-6;
constexpr double kParamTol = 2e-6;
constexpr int kSteps = 5;
constexpr std::int64_t kBatch = 4, kT = 32, kVocab = 64;

models::TransformerConfig gpt_config(float dropout = 0.f) {
  return {.vocab = kVocab,
          .d_model = 32,
          .num_layers = 2,
          .num_heads = 4,
          .max_len = kT,
          .dropout = dropout};
}

// The GPT laid out as `cp` and `tp` say, its loss on this device's share of the sequences.
ParityModel gpt(const ContextPlan& cp, const parallel::TPPlan& tp = {},
                const nn::FullySharded* fsdp = nullptr, float dropout = 0.f) {
  models::TransformerConfig c = gpt_config(dropout);
  c.cp = cp;
  c.tp = tp;
  const auto model = std::make_shared<const models::Transformer>(c);
  ParityModel m;
  m.init = [model, fsdp](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx) {
    return model->init(key, specs, ctx, fsdp);
  };
  m.loss = [model, cp, fsdp](const nn::Scope& scope, const train::Batch& batch) {
    train::Batch local = batch;
    if (cp.active()) {
      const int me = scope.axis_index(cp.axis);
      local = batch.map([&](const tensor::Tensor& t) { return cp.layout.shard(t, 1, me); });
    }
    const nn::Scope s = fsdp != nullptr ? scope.fully_sharded(*fsdp) : scope;
    return model->loss(s, local.inputs, local.labels);
  };
  if (fsdp != nullptr) m.fully_sharded = mesh::Axes(fsdp->axis);
  return m;
}

// Data parallelism over "data" (when the mesh has it) and "context" together.
testing::StrategyFactory averaged_over_data_and_context(const mesh::Axes& fully_sharded = {}) {
  return [fully_sharded](spmd::DeviceContext& ctx, const nn::ParamSpecs& specs) {
    const bool data = ctx.mesh().has_axis("data");
    const mesh::Axes axes = data ? mesh::Axes({"data", "context"}) : mesh::Axes("context");
    // Dropout keys of the data replica (as app::Composed): drawn by global position.
    return std::make_unique<parallel::DataParallel>(
        ctx, axes, &specs,
        parallel::DataParallelOptions{.fully_sharded = fully_sharded,
                                      .key_axes = data ? mesh::Axes("data") : mesh::Axes()});
  };
}

const optim::SGD& sgd() {
  static const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  return opt;
}

const std::vector<train::Batch>& batches() {
  static const auto b = testing::random_token_batches(kSteps, kBatch, kT, kVocab, 5);
  return b;
}

const TrainingRun& one_device() {
  static const TrainingRun run = testing::train_one_device(gpt({}), sgd(), batches());
  return run;
}

struct Case {
  std::string name;
  mesh::Mesh mesh;
  ContextMethod method = ContextMethod::Ring;
  bool balanced = true;
  parallel::TPPlan tp{};
  bool fsdp = false;
};

class ContextParallelGpt : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallelGpt, TrainsAsOneDevice) {
  const Case& c = GetParam();
  const ContextPlan cp{.layout = {.size = c.mesh.axis_size("context"), .balanced = c.balanced},
                       .method = c.method};
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = 0};
  const TrainingRun run = testing::train_on_mesh(
      c.mesh, gpt(cp, c.tp, c.fsdp ? &fsdp : nullptr), sgd(), batches(), {},
      averaged_over_data_and_context(c.fsdp ? mesh::Axes("data") : mesh::Axes()));
  testing::expect_same_run(one_device(), run, kParamTol, c.name);
  testing::expect_params_within_norm(one_device(), run, kTol, c.name);
  for (std::size_t s = 0; s < run.losses.size(); ++s) {
    EXPECT_NEAR(run.losses[s], one_device().losses[s], kTol * one_device().losses[s]) << s;
    EXPECT_NEAR(run.grad_norms[s], one_device().grad_norms[s], kTol * one_device().grad_norms[s])
        << s;
  }
}

std::vector<Case> cases() {
  const parallel::TPPlan megatron_sp{.layout = TPLayout::Megatron, .sequence_parallel = true};
  return {
      {"ring cp=2", mesh::Mesh({2}, {"context"})},
      {"ring cp=4", mesh::Mesh({4}, {"context"})},
      {"ring cp=8", mesh::Mesh({8}, {"context"})},
      {"ring plain cp=4", mesh::Mesh({4}, {"context"}), ContextMethod::Ring, false},
      {"ulysses cp=2", mesh::Mesh({2}, {"context"}), ContextMethod::Ulysses},
      {"ulysses cp=4", mesh::Mesh({4}, {"context"}), ContextMethod::Ulysses},
      {"ring dp=2 x cp=2", mesh::Mesh({2, 2}, {"data", "context"})},
      {"ulysses dp=2 x cp=2", mesh::Mesh({2, 2}, {"data", "context"}), ContextMethod::Ulysses},
      {"ring cp=2 x tp=2 megatron sp", mesh::Mesh({2, 2}, {"context", "model"}),
       ContextMethod::Ring, true, megatron_sp},
      {"ulysses cp=2 x tp=2 megatron", mesh::Mesh({2, 2}, {"context", "model"}),
       ContextMethod::Ulysses, true, {.layout = TPLayout::Megatron}},
      {"ring dp=2 x cp=2 x tp=2 sp", mesh::Mesh({2, 2, 2}, {"data", "context", "model"}),
       ContextMethod::Ring, true, megatron_sp},
      {"ring fsdp dp=2 x cp=2", mesh::Mesh({2, 2}, {"data", "context"}), ContextMethod::Ring, true,
       {}, true},
  };
}

// With dropout (0.1 on the embedding and every residual branch): each chunk of a device
// draws its block of the whole sequence's mask from the same key as one device, so the
// split runs drop the same elements (meshes without a data axis, whose devices then all
// draw with the one device's key).
TEST(ContextParallelGptDropout, DropsWhatOneDeviceDrops) {
  constexpr float kRate = 0.1f;
  const TrainingRun one = testing::train_one_device(gpt({}, {}, nullptr, kRate), sgd(), batches());
  struct DropCase {
    std::string name;
    mesh::Mesh mesh;
    ContextMethod method;
    parallel::TPPlan tp{};
  };
  for (const DropCase& c :
       {DropCase{"ring cp=4", mesh::Mesh({4}, {"context"}), ContextMethod::Ring},
        DropCase{"ulysses cp=2", mesh::Mesh({2}, {"context"}), ContextMethod::Ulysses},
        DropCase{"ring cp=2 x tp=2 megatron", mesh::Mesh({2, 2}, {"context", "model"}),
                 ContextMethod::Ring, {.layout = TPLayout::Megatron}},
        DropCase{"ring cp=2 x tp=2 gather", mesh::Mesh({2, 2}, {"context", "model"}),
                 ContextMethod::Ring, {.layout = TPLayout::Gather}}}) {
    const ContextPlan cp{.layout = {.size = c.mesh.axis_size("context")}, .method = c.method};
    const TrainingRun run = testing::train_on_mesh(c.mesh, gpt(cp, c.tp, nullptr, kRate), sgd(),
                                                   batches(), {}, averaged_over_data_and_context());
    testing::expect_same_run(one, run, kParamTol, c.name + " with dropout");
    testing::expect_params_within_norm(one, run, kTol, c.name + " with dropout");
  }
  // The masks matter: without dropout the run differs.
  EXPECT_NE(one.losses.back(), one_device().losses.back());
}

INSTANTIATE_TEST_SUITE_P(Meshes, ContextParallelGpt, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n;
                           for (char ch : info.param.name)
                             n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace distjax
