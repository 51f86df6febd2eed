// ZeRO-3 / FSDP (nn::Scope::fully_sharded) against one device and the ZeRO paper: the
// sharding rule, the same losses and parameters as one device over 5 AdamW steps (alone,
// HSDP, with tensor parallelism, with and without remat), memory per device 16/N bytes
// per sharded parameter, and communication 1.5x data parallelism's when every module
// gathers again in backward.
#include <gtest/gtest.h>

#include "distjax/mesh/named_sharding.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/fsdp_gather.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "parallel/parity_util.hpp"
#include "spmd/spmd_test_util.hpp"

namespace distjax::parallel {
namespace {

using mesh::Mesh;
using mesh::P;
using models::TransformerTP;
using spmd::DeviceContext;
using testing::expect_same_run;
using testing::ParityModel;
using testing::train_on_mesh;
using testing::train_one_device;
using testing::TrainingRun;

constexpr int kSteps = 5;
// As in zero_test.cpp: Adam's eps at 1e-4 keeps the zero-in-exact-arithmetic gradient of
// the attention's key bias (f32 noise) from being normalised to +-lr.
constexpr double kAdamTol = 2e-5;

const optim::AdamW& adamw() {
  static const optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2),
                                 .eps = 1e-4,
                                 .weight_decay = 1e-2,
                                 .decay_mask = optim::default_decay_mask()});
  return opt;
}

models::TransformerConfig gpt_config(bool remat, TransformerTP tp = {}) {
  return {.vocab = 32,
          .d_model = 16,
          .num_layers = 2,
          .num_heads = 4,
          .mlp_ratio = 2,
          .max_len = 8,
          .remat = remat,
          .tp = tp};
}

std::vector<train::Batch> tokens(std::int64_t batch) {
  return testing::random_token_batches(kSteps, batch, 8, 32, 9);
}

// The GPT with its parameters fully sharded over `axis` on a mesh (whole on one device).
ParityModel fsdp_gpt(const models::Transformer& m, nn::FullySharded fsdp) {
  return {[&m, fsdp](Key k, nn::ParamSpecs* s, DeviceContext* ctx) {
            return m.init(k, s, ctx, ctx ? &fsdp : nullptr);
          },
          [&m, fsdp](const nn::Scope& s, const train::Batch& b) {
            return m.loss(s.context() ? s.fully_sharded(fsdp) : s, b.inputs, b.labels);
          },
          fsdp.axis};
}

// Data parallelism over `axes`, its parameters fully sharded over "data".
testing::StrategyFactory data_parallel(mesh::Axes axes) {
  return [axes](DeviceContext& ctx, const nn::ParamSpecs& specs) {
    return std::make_unique<DataParallel>(ctx, axes, &specs,
                                          parallel::DataParallelOptions{.fully_sharded = "data"});
  };
}

TEST(FullyShardedSpec, ShardsTheLargestDivisibleDimension) {
  const Mesh m({2, 4}, {"data", "model"});
  int dim = -2;
  EXPECT_EQ(mesh::fully_sharded_spec({4096, 512}, P(), m, "data", 0, &dim),
            P("data", std::nullopt));
  EXPECT_EQ(dim, 0);
  // Extents after the model split tie (1024, 1024): the last dimension, data minor.
  EXPECT_EQ(mesh::fully_sharded_spec({1024, 4096}, P(std::nullopt, "model"), m, "data", 0, &dim),
            P(std::nullopt, {"model", "data"}));
  EXPECT_EQ(dim, 1);
  // Below the threshold, already sharded over the axis, or nothing divides: unchanged.
  EXPECT_EQ(mesh::fully_sharded_spec({64, 64}, P(), m, "data", 1 << 18, &dim), P());
  EXPECT_EQ(dim, -1);
  EXPECT_EQ(mesh::fully_sharded_spec({8, 8}, P("data"), m, "data", 0, &dim), P("data"));
  EXPECT_EQ(mesh::fully_sharded_spec({3, 5}, P(), m, "data", 0, &dim), P());
  EXPECT_EQ(dim, -1);
}

TEST(Fsdp, MatchesOneDeviceWithAndWithoutRemat) {
  const auto data = tokens(8);
  for (bool remat : {false, true}) {
    const models::Transformer gpt(gpt_config(remat));
    const TrainingRun one = train_one_device(fsdp_gpt(gpt, {}), adamw(), data);
    for (int n : {2, 4}) {
      const TrainingRun run =
          train_on_mesh(Mesh({n}, {"data"}), fsdp_gpt(gpt, {.min_weight_size = 64}), adamw(), data);
      expect_same_run(one, run, kAdamTol,
                      "ZeRO-3 on " + std::to_string(n) + (remat ? ", remat" : ""));
    }
  }
}

TEST(Fsdp, ModulesByKindMatchOneDevice) {
  // The toolkit's fsdp.modules: only the parameters of the listed module kinds are fully
  // sharded (with and without remat, which re-gathers them in backward).
  const auto data = tokens(8);
  for (bool remat : {false, true}) {
    const models::Transformer gpt(gpt_config(remat));
    const TrainingRun one = train_one_device(fsdp_gpt(gpt, {}), adamw(), data);
    for (const std::vector<std::string>& modules :
         {std::vector<std::string>{"MLP"}, std::vector<std::string>{"Attn", "MLP"},
          std::vector<std::string>{"Block"}}) {
      const nn::FullySharded fsdp{.min_weight_size = 64, .modules = modules};
      const TrainingRun run =
          train_on_mesh(Mesh({2}, {"data"}), fsdp_gpt(gpt, fsdp), adamw(), data);
      std::string what = "ZeRO-3 of";
      for (const auto& m : modules)
        what += " " + m;
      expect_same_run(one, run, kAdamTol, what + (remat ? ", remat" : ""));
    }
  }
  // Which parameters are split: the MLP's kernels only, with {"MLP"}.
  const models::Transformer gpt(gpt_config(false));
  nn::ParamSpecs specs;
  spmd::shard_map(Mesh({2}, {"data"}),
                  [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                    nn::ParamSpecs s;
                    const nn::FullySharded fsdp{.min_weight_size = 64, .modules = {"MLP"}};
                    gpt.init(Key::from_seed(1), &s, &ctx, &fsdp);
                    if (ctx.device() == 0) specs = s;
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
  ASSERT_TRUE(specs.count("blocks/0/mlp/fc1/kernel"));
  EXPECT_TRUE(specs.at("blocks/0/mlp/fc1/kernel").uses("data"));
  EXPECT_TRUE(specs.at("blocks/0/mlp/fc2/kernel").uses("data"));
  EXPECT_FALSE(specs.count("blocks/0/attn/qkv/kernel") &&
               specs.at("blocks/0/attn/qkv/kernel").uses("data"));
  EXPECT_FALSE(specs.count("wte/embedding") && specs.at("wte/embedding").uses("data"));
}

TEST(Fsdp, PrefetchGivesTheSameRunAndServesTheGathers) {
  const auto data = tokens(8);
  const models::Transformer gpt(gpt_config(/*remat=*/true));
  const TrainingRun one = train_one_device(fsdp_gpt(gpt, {}), adamw(), data);
  constexpr int n = 4;
  std::vector<std::unique_ptr<nn::FsdpPrefetcher>> prefetchers;
  for (int d = 0; d < n; ++d)
    prefetchers.push_back(std::make_unique<nn::FsdpPrefetcher>(2));
  const ParityModel model{[&gpt](Key k, nn::ParamSpecs* s, DeviceContext* ctx) {
                            const nn::FullySharded fsdp{.min_weight_size = 64};
                            return gpt.init(k, s, ctx, ctx ? &fsdp : nullptr);
                          },
                          [&](const nn::Scope& s, const train::Batch& b) {
                            if (!s.context()) return gpt.loss(s, b.inputs, b.labels);
                            const nn::FullySharded fsdp{
                                .min_weight_size = 64,
                                .prefetch = prefetchers[s.context()->device()].get()};
                            return gpt.loss(s.fully_sharded(fsdp), b.inputs, b.labels);
                          },
                          "data"};
  expect_same_run(one, train_on_mesh(Mesh({n}, {"data"}), model, adamw(), data), kAdamTol,
                  "ZeRO-3 with prefetch");
  // The first pass records the order; from the second on every gather but the first of a
  // pass is served by a prefetch (forward, and the recomputation under remat).
  for (int d = 0; d < n; ++d) {
    EXPECT_GT(prefetchers[d]->hits(), 0) << "device " << d;
    EXPECT_GT(prefetchers[d]->hits(), 3 * prefetchers[d]->misses()) << "device " << d;
  }
}

TEST(Fsdp, ClassifierMatchesOneDevice) {
  static const models::Classifier clf(
      {.in_features = 16, .hidden = 32, .num_classes = 8, .dropout = 0.f});
  const nn::FullySharded fsdp{.min_weight_size = 64};
  const ParityModel model{
      [fsdp](Key k, nn::ParamSpecs* s, DeviceContext* ctx) {
        return clf.init(k, s, ctx, ctx ? &fsdp : nullptr);
      },
      [fsdp](const nn::Scope& s, const train::Batch& b) {
        const nn::Scope scope = s.context() ? s.fully_sharded(fsdp) : s;
        return tensor::mean(tensor::cross_entropy(clf(scope, b.inputs), b.labels));
      },
      "data"};
  std::vector<train::Batch> data;
  for (int s = 0; s < kSteps; ++s) {
    Key k = Key::from_seed(4).fold_in(static_cast<std::uint64_t>(s));
    std::vector<std::int32_t> y(16);
    for (std::int64_t i = 0; i < 16; ++i)
      y[i] = static_cast<std::int32_t>(k.fold_in(50 + i).bits(0)[0] % 8);
    data.push_back({testing::random_tensor(k, {16, 16}), Tensor::from_vector(y, {16})});
  }
  const TrainingRun one = train_one_device(model, adamw(), data);
  for (int n : {2, 4, 8})
    expect_same_run(one, train_on_mesh(Mesh({n}, {"data"}), model, adamw(), data), kAdamTol,
                    "ZeRO-3 classifier on " + std::to_string(n));
}

TEST(Fsdp, HsdpAndFsdpTimesTensorParallelMatchOneDevice) {
  const auto data = tokens(8);
  const models::Transformer plain(gpt_config(true));
  const TrainingRun one = train_one_device(fsdp_gpt(plain, {}), adamw(), data);
  // HSDP: replicated over "replica", fully sharded over "data"; the batch over both.
  expect_same_run(one,
                  train_on_mesh(Mesh({2, 4}, {"replica", "data"}),
                                fsdp_gpt(plain, {.axis = "data", .min_weight_size = 64}), adamw(),
                                data, {}, data_parallel(mesh::Axes({"replica", "data"}))),
                  kAdamTol, "HSDP (2 replicas x 4 shards)");
  // FSDP over "data" x Megatron over "model".
  const models::Transformer tp(gpt_config(true, {.layout = TPLayout::Megatron}));
  expect_same_run(one,
                  train_on_mesh(Mesh({2, 4}, {"data", "model"}),
                                fsdp_gpt(tp, {.min_weight_size = 64}), adamw(), data),
                  kAdamTol, "FSDP x TP on (2, 4)");
}

// ------------------------------------------------------------ memory and communication

struct Figures {
  std::int64_t held = 0;                        // bytes of parameters + gradients + optimizer state
  std::int64_t sharded = 0;                     // parameters (elements) stored split over "data"
  std::int64_t replicated = 0;                  // the others
  std::int64_t sent = 0;                        // bytes device 0 sent in one step (all collectives)
  std::int64_t sent_blocks = 0, sent_rest = 0;  // expected, see below
};

Figures fsdp_step(int n) {
  Figures f;
  const models::Transformer gpt(gpt_config(/*remat=*/true));
  const nn::FullySharded fsdp{.min_weight_size = 64};
  const auto data = tokens(8);
  spmd::shard_map(
      Mesh({n}, {"data"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        DataParallel dp(ctx, "data", &specs, {.fully_sharded = "data"});
        auto state = train::TrainState::create(gpt.init(Key::from_seed(1), &specs, &ctx, &fsdp),
                                               adamw(), Key::from_seed(2), dp);
        const int i = ctx.axis_index("data");
        const std::int64_t per = 8 / n;
        const train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
          return std::make_pair(gpt.loss(nn::Scope::apply(&p, true, k).on(ctx).fully_sharded(fsdp),
                                         b.inputs, b.labels),
                                train::Metrics{});
        };
        ctx.comm_stats().reset();
        auto r = dp.forward_backward(fn, state.params, data[0].slice(i * per, (i + 1) * per),
                                     Key::from_seed(3), 1);
        TensorTree grads = dp.finalize_grads(std::move(r.grads));
        dp.apply_update(adamw(), state.params, grads, state.opt_state, 0);
        if (ctx.device() == 0) {
          f.held = state.params.storage_bytes() + grads.storage_bytes() +
                   state.opt_state.storage_bytes();
          f.sent = ctx.comm_stats().total_bytes_sent();
          for (const auto& [path, p] : state.params) {
            const bool split = specs.count(path) && specs.at(path).uses("data");
            (split ? f.sharded : f.replicated) += split ? p.numel() * n : p.numel();
            // Blocks run under remat: gathered forward, gathered again backward, gradient
            // reduce-scattered: 3 (n-1)/n of the parameter's bytes. The embeddings are
            // gathered once (2 (n-1)/n); replicated leaves are all-reduced (2 (n-1)/n).
            const std::int64_t bytes = 4 * (split ? p.numel() * n : p.numel());
            const bool in_block = path.rfind("blocks/", 0) == 0;
            if (split && in_block) {
              f.sent_blocks += 3 * (n - 1) * bytes / n;
            } else {
              f.sent_rest += 2 * (n - 1) * bytes / n;
            }
          }
        }
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  return f;
}

TEST(Fsdp, MemoryPerDeviceIs16OverNPerShardedParameter) {
  for (int n : {2, 4, 8}) {
    const Figures f = fsdp_step(n);
    ASSERT_GT(f.sharded, 0);
    EXPECT_GT(f.sharded, 10 * f.replicated);  // almost everything is sharded
    EXPECT_EQ(f.held, 16 * f.sharded / n + 16 * f.replicated) << "N=" << n;
  }
}

TEST(Fsdp, CommunicationIsOneAndAHalfTimesDataParallelism) {
  for (int n : {2, 4, 8}) {
    const Figures f = fsdp_step(n);
    // Gradient norm and metrics are not part of this step (no clipping, no metric sync).
    EXPECT_EQ(f.sent, f.sent_blocks + f.sent_rest) << "N=" << n;
  }
}

}  // namespace
}  // namespace distjax::parallel
