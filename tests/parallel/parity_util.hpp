// The parity harness of the parallel strategies: one model trained on one device and on
// a mesh (tensor parallel over "model", data parallel over "data" when the mesh has it)
// from the same initial parameters and batches must give the same losses and the same
// final parameters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distjax/nn/scope.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::testing {

using tensor::Tensor;
using tensor::TensorTree;

/// `steps` batches of (batch, t) random token ids and next-token targets in [0, vocab).
inline std::vector<train::Batch> random_token_batches(int steps, std::int64_t batch, std::int64_t t,
                                                      std::int64_t vocab, std::uint64_t seed) {
  std::vector<train::Batch> out;
  for (int s = 0; s < steps; ++s) {
    const Key k = Key::from_seed(seed).fold_in(static_cast<std::uint64_t>(s));
    std::vector<std::int32_t> x(batch * t), y(batch * t);
    for (std::int64_t i = 0; i < batch * t; ++i) {
      const auto bits = k.bits(static_cast<std::uint64_t>(i));
      x[i] = static_cast<std::int32_t>(bits[0] % vocab);
      y[i] = static_cast<std::int32_t>(bits[1] % vocab);
    }
    out.push_back({Tensor::from_vector(x, {batch, t}), Tensor::from_vector(y, {batch, t})});
  }
  return out;
}

/// How a test builds and runs its model on any scope.
struct ParityModel {
  /// Parameters: this device's shards with a context, the whole model without.
  std::function<TensorTree(Key, nn::ParamSpecs*, spmd::DeviceContext*)> init;
  /// Scalar mean loss of a batch on a scope (replicated along the model axis).
  std::function<Tensor(const nn::Scope&, const train::Batch&)> loss;
  /// The data axes its parameters are stored fully sharded over (Scope::fully_sharded),
  /// for the default DataParallel's sharding lint.
  mesh::Axes fully_sharded{};
};

struct TrainingRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // before clipping
  TensorTree params;               // global
};

inline train::LossFn parity_loss_fn(const ParityModel& model, spmd::DeviceContext* ctx) {
  return [&model, ctx](const TensorTree& p, const train::Batch& b, Key k) {
    nn::Scope s = nn::Scope::apply(&p, /*train=*/true, k);
    if (ctx != nullptr) s = s.on(*ctx);
    return std::make_pair(model.loss(s, b), train::Metrics{});
  };
}

/// The reference: one device, no mesh.
/// Gradients are clipped to this global norm in every run: small enough that the steps
/// really clip, so a norm that missed a shard (or counted a replicated leaf twice) shows.
constexpr double kParityMaxGradNorm = 0.5;

inline TrainingRun train_one_device(const ParityModel& model, const optim::Optimizer& opt,
                                    const std::vector<train::Batch>& batches,
                                    int num_minibatches = 1) {
  auto state = train::TrainState::create(model.init(Key::from_seed(1), nullptr, nullptr), opt,
                                         Key::from_seed(2));
  TrainingRun run;
  const train::LossFn fn = parity_loss_fn(model, nullptr);
  for (const auto& b : batches) {
    const train::Metrics m = train::train_step(
        state, b, fn, opt,
        {.num_minibatches = num_minibatches, .max_grad_norm = kParityMaxGradNorm});
    run.losses.push_back(m.mean("loss"));
    run.grad_norms.push_back(m.mean("grad_norm"));
  }
  run.params = state.params;
  return run;
}

/// Makes the strategy of a mesh run on each device (null: DataParallel over "data" when
/// the mesh has that axis, else TensorParallel over "model").
using StrategyFactory =
    std::function<std::unique_ptr<train::Strategy>(spmd::DeviceContext&, const nn::ParamSpecs&)>;

/// The same on `mesh`: each device creates its shards, trains on its slice of every batch
/// along "data" (data parallel when the mesh has a "data" axis of size > 1), and the final
/// shards are assembled with each parameter's spec. Losses of device 0; every device must
/// report the same losses.
inline TrainingRun train_on_mesh(const mesh::Mesh& mesh, const ParityModel& model,
                                 const optim::Optimizer& opt,
                                 const std::vector<train::Batch>& batches,
                                 spmd::ShardMapOptions options = {},
                                 const StrategyFactory& make_strategy = nullptr,
                                 int num_minibatches = 1) {
  const bool has_data = mesh.has_axis("data");
  const int n_data = has_data ? mesh.axis_size("data") : 1;
  // Paths and specs as the mesh's devices create them (fully sharded parameters get
  // their spec from the mesh), read from device 0.
  nn::ParamSpecs specs;
  std::vector<std::string> paths;
  spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs s;
        const TensorTree p = model.init(Key::from_seed(1), &s, &ctx);
        if (ctx.device() == 0) {
          specs = s;
          paths = p.paths();
        }
        return std::vector<Tensor>{};
      },
      {}, {}, options)(std::vector<Tensor>{});
  std::vector<mesh::PartitionSpec> out_specs;
  for (const auto& p : paths)
    out_specs.push_back(specs.count(p) ? specs.at(p) : mesh::PartitionSpec());
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(mesh.size()));
  std::vector<double> norms;
  auto f = spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs my_specs;
        TensorTree shards = model.init(Key::from_seed(1), &my_specs, &ctx);
        EXPECT_EQ(my_specs, specs);
        std::unique_ptr<train::Strategy> strategy;
        if (make_strategy) {
          strategy = make_strategy(ctx, my_specs);
        } else if (has_data) {
          strategy = std::make_unique<parallel::DataParallel>(
              ctx, "data", &my_specs,
              parallel::DataParallelOptions{.fully_sharded = model.fully_sharded});
        } else {
          strategy = std::make_unique<parallel::TensorParallel>(ctx, "model");
        }
        auto state = train::TrainState::create(shards, opt, Key::from_seed(2), *strategy);
        const train::TrainStepOptions step_options{.num_minibatches = num_minibatches,
                                                   .max_grad_norm = kParityMaxGradNorm,
                                                   .strategy = strategy.get()};
        const train::LossFn fn = parity_loss_fn(model, &ctx);
        const int i = has_data ? ctx.axis_index("data") : 0;
        for (const auto& b : batches) {
          const std::int64_t per = b.size() / n_data;
          const train::Metrics m =
              train::train_step(state, b.slice(i * per, (i + 1) * per), fn, opt, step_options);
          losses[static_cast<std::size_t>(ctx.device())].push_back(m.mean("loss"));
          if (ctx.device() == 0) norms.push_back(m.mean("grad_norm"));
        }
        std::vector<Tensor> out;
        for (const auto& p : paths)
          out.push_back(state.params.at(p));
        return out;
      },
      {}, out_specs, options);
  std::vector<mesh::ShardedArray> out = f(std::vector<Tensor>{});
  TrainingRun run{losses[0], norms, {}};
  for (std::size_t j = 0; j < paths.size(); ++j)
    run.params.set(paths[j], mesh::gather(out[j]));
  for (std::size_t d = 1; d < losses.size(); ++d)
    EXPECT_EQ(losses[d], losses[0]) << "device " << d;
  return run;
}

/// Same losses (relative `tol`) and, per parameter, max |difference| <= tol x max |value|.
inline void expect_same_run(const TrainingRun& one, const TrainingRun& other, double tol,
                            const std::string& what) {
  ASSERT_EQ(one.losses.size(), other.losses.size()) << what;
  for (std::size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(other.losses[s], one.losses[s], tol * std::abs(one.losses[s]))
        << what << ", step " << s;
  ASSERT_EQ(one.grad_norms.size(), other.grad_norms.size()) << what;
  for (std::size_t s = 0; s < one.grad_norms.size(); ++s)
    EXPECT_NEAR(other.grad_norms[s], one.grad_norms[s], tol * one.grad_norms[s])
        << what << ", gradient norm at step " << s;
  ASSERT_TRUE(one.params.same_structure(other.params)) << what;
  for (const auto& [path, a] : one.params) {
    const Tensor& b = other.params.at(path);
    ASSERT_EQ(a.shape(), b.shape()) << what << ": " << path;
    auto va = a.to_vector<float>(), vb = b.to_vector<float>();
    double max_ref = 0, max_diff = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(double(va[i])));
      max_diff = std::max(max_diff, std::abs(double(va[i]) - vb[i]));
    }
    EXPECT_LE(max_diff, tol * max_ref) << what << ": " << path;
    // DISTJAX_PARITY_REPORT=1: every tensor's distance, to see the margin on a new device.
    if (std::getenv("DISTJAX_PARITY_REPORT") != nullptr)
      std::fprintf(stderr, "[parity] %s: %s max|diff| / max|value| = %.3g (tolerance %.3g)\n",
                   what.c_str(), path.c_str(), max_diff / max_ref, tol);
  }
  // Training moved the parameters, so the comparison is not vacuous.
  EXPECT_NE(one.losses.front(), one.losses.back()) << what;
}

/// Every parameter within `tol` relative in norm, ||other - one|| <= tol ||one|| per tensor
/// (a bias that starts at 0 is compared with its own size, not with its largest element).
inline void expect_params_within_norm(const TrainingRun& one, const TrainingRun& other, double tol,
                                      const std::string& what) {
  ASSERT_TRUE(one.params.same_structure(other.params)) << what;
  double worst = 0;
  for (const auto& [path, a] : one.params) {
    const auto va = a.to_vector<float>(), vb = other.params.at(path).to_vector<float>();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
      diff += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
      norm += double(va[i]) * va[i];
    }
    const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tol) << what << ": " << path;
  }
  if (std::getenv("DISTJAX_PARITY_REPORT") != nullptr)
    std::fprintf(stderr, "[parity] %s: worst ||diff|| / ||value|| = %.3g (tolerance %.3g)\n",
                 what.c_str(), worst, tol);
}

}  // namespace distjax::testing
