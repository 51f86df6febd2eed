// Checkpoints: round trip, resharding onto other meshes and strategies, exact resumption
// (also after SIGKILL, and after a kill in the middle of a save), clear errors for broken
// files, and the files read by Python's safetensors.
#include "distjax/train/checkpoint.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "distjax/data/loader.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"
#include "parallel/parity_util.hpp"

namespace distjax::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;

// A fresh scratch directory per test.
std::string scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("distjax_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void expect_bitwise_equal(const TensorTree& a, const TensorTree& b, const std::string& what) {
  ASSERT_EQ(a.paths(), b.paths()) << what;
  for (const auto& [path, t] : a) {
    const Tensor& u = b.at(path);
    ASSERT_EQ(t.shape(), u.shape()) << what << ": " << path;
    ASSERT_EQ(t.dtype(), u.dtype()) << what << ": " << path;
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()), 0) << what << ": " << path;
  }
}

// Runs `fn` on every device of `mesh` (threads backend).
void on_mesh(const Mesh& mesh, const std::function<void(DeviceContext&)>& fn) {
  spmd::shard_map(
      mesh,
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

TEST(Checkpoint, OneDeviceRoundTrip) {
  const std::string dir = scratch("roundtrip");
  Small s;
  TrainState a = s.trained();
  a.rng = Key{{123u, 456u}};
  const std::string step_dir =
      save_checkpoint(dir, a, {}, {.data = {2, 5}, .config = R"({"lr": 0.01, "name": "x"})"});
  EXPECT_EQ(step_dir, (fs::path(dir) / "step_00000003").string());
  EXPECT_TRUE(fs::exists(fs::path(step_dir) / "index.json"));
  EXPECT_TRUE(fs::exists(fs::path(step_dir) / "device_00000.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000003.tmp"));
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000003");

  TrainState b = s.fresh(/*seed=*/9);
  const CheckpointMeta meta = load_checkpoint(dir, b, {});
  EXPECT_EQ(meta.path, step_dir);
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(b.rng, a.rng);
  EXPECT_EQ(meta.data, (DataPosition{2, 5}));
  EXPECT_EQ(json::parse(meta.config), json::parse(R"({"lr": 0.01, "name": "x"})"));
  expect_bitwise_equal(a.params, b.params, "params");
  expect_bitwise_equal(a.opt_state, b.opt_state, "opt_state");
  // The load really replaced the values (a fresh state of another seed differs).
  EXPECT_NE(s.fresh(9).params.at("fc1/kernel").to_vector<float>(),
            b.params.at("fc1/kernel").to_vector<float>());
}

TEST(Checkpoint, InspectPrintsTheIndex) {
  const std::string dir = scratch("inspect");
  Small s;
  save_checkpoint(dir, s.trained(), {});
  std::ostringstream os;
  inspect_checkpoint(dir, os);
  const std::string text = os.str();
  EXPECT_NE(text.find("step 3"), std::string::npos) << text;
  EXPECT_NE(text.find("(one device)"), std::string::npos) << text;
  EXPECT_NE(text.find("params/fc1/kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("opt_state/mu/fc1/kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("(6, 8)"), std::string::npos) << text;
  EXPECT_NE(text.find("device_00000.safetensors"), std::string::npos) << text;
}

TEST(Checkpoint, KeepLastPrunesOlderSteps) {
  const std::string dir = scratch("keep");
  Small s;
  TrainState a = s.fresh();
  for (int step : {1, 2, 3, 4}) {
    a.step = step;
    save_checkpoint(dir, a, {}, {.keep_last = 2});
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000002"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_00000003"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_00000004"));
  // Saving a step again replaces it.
  save_checkpoint(dir, a, {}, {.keep_last = 2});
  EXPECT_EQ(*find_checkpoint(dir), (fs::path(dir) / "step_00000004").string());
}

}  // namespace
}  // namespace distjax::train
