// What the checkpoint tests share: scratch directories removed at exit, a bitwise
// comparison of trees, running a function on every device of a mesh, and a small
// one-device model with a state trained a few steps.
#pragma once

#include "distjax/train/checkpoint.hpp"
#include "distjax/train/checkpointer.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "distjax/data/loader.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"
#include "parallel/parity_util.hpp"

namespace distjax::train::checkpoint_testing {

namespace fs = std::filesystem;
using json = nlohmann::json;
using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;

// Scratch directories, removed when the test program ends.
class ScratchDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : dirs)
      fs::remove_all(d);
  }
  std::vector<fs::path> dirs;
};
inline ScratchDirs* const scratch_dirs =
    static_cast<ScratchDirs*>(::testing::AddGlobalTestEnvironment(new ScratchDirs));

// A fresh scratch directory.
inline std::string scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("distjax_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  scratch_dirs->dirs.push_back(p);
  return p.string();
}

inline void expect_bitwise_equal(const TensorTree& a, const TensorTree& b, const std::string& what) {
  ASSERT_EQ(a.paths(), b.paths()) << what;
  for (const auto& [path, t] : a) {
    const Tensor& u = b.at(path);
    ASSERT_EQ(t.shape(), u.shape()) << what << ": " << path;
    ASSERT_EQ(t.dtype(), u.dtype()) << what << ": " << path;
    const Tensor ht = t.to(Device::cpu()), hu = u.to(Device::cpu());  // bytes through the table
    EXPECT_EQ(std::memcmp(ht.raw_data(), hu.raw_data(), t.nbytes()), 0) << what << ": " << path;
  }
}

// Runs `fn` on every device of `mesh` (threads backend).
inline void on_mesh(const Mesh& mesh, const std::function<void(DeviceContext&)>& fn) {
  spmd::shard_map(mesh,
                  [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                    fn(ctx);
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
}

// ------------------------------------------------------------ one device

struct Small {
  models::Classifier model{{.in_features = 6, .hidden = 8, .num_classes = 3, .dropout = 0.f}};
  optim::Adam opt{{.learning_rate = optim::constant_schedule(0.01)}};
  TrainState fresh(std::uint64_t seed = 1) const {
    return TrainState::create(model.init(Key::from_seed(seed)), opt, Key::from_seed(2));
  }
  // A state whose values are all different from a fresh one's (moments non-zero).
  TrainState trained() const {
    TrainState s = fresh();
    const data::ArrayDataset d = data::synthetic_classification(16, 6, 3, Key::from_seed(3));
    LossFn loss = [this](const TensorTree& p, const Batch& b, Key k) {
      return std::make_pair(
          tensor::mean(tensor::cross_entropy(model.apply(p, b.inputs, false, k), b.labels)),
          Metrics{});
    };
    for (int i = 0; i < 3; ++i)
      train_step(s, {d.inputs, d.labels}, loss, opt);
    return s;
  }
};

// ------------------------------------------------------------ the GPT on meshes

inline models::TransformerConfig gpt_config() {
  return {.vocab = 32,
          .d_model = 32,
          .num_layers = 2,
          .num_heads = 8,
          .mlp_ratio = 2,
          .max_len = 8,
          .tp = {.layout = parallel::TPLayout::Megatron, .vocab_parallel = true}};
}

struct GptRun {
  models::Transformer model{gpt_config()};
  optim::Adam opt{{.learning_rate = optim::constant_schedule(0.01)}};
  std::vector<Batch> batches = testing::random_token_batches(5, 8, 8, 32, 21);
};

inline mesh::Axes data_axes(const Mesh& m) {
  mesh::Axes out;
  for (const auto& a : m.axis_names())
    if (a != "model") out.names.push_back(a);
  return out;
}

enum class Kind { DataParallel, Zero1, Zero2 };

inline std::unique_ptr<train::Strategy> make_strategy(Kind kind, DeviceContext& ctx,
                                                  const mesh::Axes& axes,
                                                  const nn::ParamSpecs& specs) {
  if (kind == Kind::DataParallel)
    return std::make_unique<parallel::DataParallel>(ctx, axes, &specs);
  return std::make_unique<parallel::ZeroDataParallel>(ctx, kind == Kind::Zero1 ? 1 : 2, axes,
                                                      &specs);
}

// On `mesh`: builds the state with `kind`, loads `load_from` when given, else trains
// batches [0, steps); saves into `save_to` when given; then trains one more step on batch
// `next` and returns that step's loss.
inline double gpt_on_mesh(const GptRun& run, const Mesh& mesh, Kind kind, const std::string& load_from,
                   int steps, const std::string& save_to, int next) {
  std::vector<double> loss(static_cast<std::size_t>(mesh.size()));
  on_mesh(mesh, [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree shards = run.model.init(Key::from_seed(1), &specs, &ctx);
    auto strategy = make_strategy(kind, ctx, data_axes(mesh), specs);
    TrainState state = TrainState::create(shards, run.opt, Key::from_seed(2), *strategy);
    const CheckpointLayout layout{&ctx, &specs, strategy.get()};
    const LossFn fn = [&](const TensorTree& p, const Batch& b, Key k) {
      const nn::Scope scope = nn::Scope::apply(&p, /*train=*/true, k).on(ctx);
      return std::make_pair(run.model.loss(scope, b.inputs, b.labels), Metrics{});
    };
    const mesh::Axes axes = data_axes(mesh);
    const int n = ctx.axis_size(axes), i = ctx.axis_index(axes);
    auto local = [&](const Batch& b) {
      const std::int64_t per = b.size() / n;
      return b.slice(i * per, (i + 1) * per);
    };
    const TrainStepOptions options{.strategy = strategy.get()};
    if (!load_from.empty()) {
      load_checkpoint(load_from, state, layout);
    } else {
      for (int s = 0; s < steps; ++s)
        train_step(state, local(run.batches[static_cast<std::size_t>(s)]), fn, run.opt, options);
    }
    if (!save_to.empty()) save_checkpoint(save_to, state, layout);
    const Metrics m =
        train_step(state, local(run.batches[static_cast<std::size_t>(next)]), fn, run.opt, options);
    loss[static_cast<std::size_t>(ctx.device())] = m.mean("loss");
  });
  return loss[0];
}

// The whole state of a checkpoint, loaded on one device (global arrays).
inline TrainState load_whole(const GptRun& run, const std::string& dir) {
  TrainState whole = TrainState::create(run.model.init(Key::from_seed(7)), run.opt, Key{});
  load_checkpoint(dir, whole, {});
  return whole;
}

}  // namespace distjax::train::checkpoint_testing
