// Checkpoints under `mpirun -np 4` (MPI backend, one device per process): each process
// writes only its own blocks, device 0 the index after the others, and the checkpoint
// holds what the threads backend's run holds; a load onto another mesh and a save again
// leave every array bitwise unchanged.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "distjax/models/transformer.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/checkpoint.hpp"
#include "distjax/train/train_step.hpp"
#include "parallel/parity_util.hpp"

using namespace distjax;
using namespace distjax::train;
using mesh::Mesh;
using tensor::Tensor;

namespace {

namespace fs = std::filesystem;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// One directory for every rank of this launch: the ranks share their parent (the MPI
// daemon of this node).
std::string shared_dir(const std::string& name) {
  return (fs::temp_directory_path() /
          ("distjax_ckpt_mpi_" + std::to_string(::getppid()) + "_" + name))
      .string();
}

const models::Transformer& gpt() {
  static const models::Transformer model({.vocab = 32,
                                          .d_model = 32,
                                          .num_layers = 2,
                                          .num_heads = 8,
                                          .mlp_ratio = 2,
                                          .max_len = 8,
                                          .tp = {.layout = parallel::TPLayout::Megatron}});
  return model;
}

const optim::Adam& adam() {
  static const optim::Adam opt({.learning_rate = optim::constant_schedule(0.01)});
  return opt;
}

// Trains `steps` steps on `mesh` (TP over "model", DP over "data") with `backend`, or loads
// `load_from`; then saves into `save_to`.
void run(const Mesh& mesh, comm::Backend backend, int steps, const std::string& load_from,
         const std::string& save_to) {
  const auto batches = distjax::testing::random_token_batches(steps, 8, 8, 32, 3);
  spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        TensorTree shards = gpt().init(Key::from_seed(1), &specs, &ctx);
        parallel::DataParallel dp(ctx, "data", &specs);
        TrainState state = TrainState::create(shards, adam(), Key::from_seed(2), dp);
        const CheckpointLayout layout{&ctx, &specs, &dp};
        if (!load_from.empty()) load_checkpoint(load_from, state, layout);
        const LossFn fn = [&](const TensorTree& p, const Batch& b, Key k) {
          const nn::Scope scope = nn::Scope::apply(&p, true, k).on(ctx);
          return std::make_pair(gpt().loss(scope, b.inputs, b.labels), Metrics{});
        };
        const int n = ctx.axis_size("data"), i = ctx.axis_index("data");
        for (const Batch& b : batches) {
          const std::int64_t per = b.size() / n;
          train_step(state, b.slice(i * per, (i + 1) * per), fn, adam(), {.strategy = &dp});
        }
        save_checkpoint(save_to, state, layout);
        return std::vector<Tensor>{};
      },
      {}, {},
      {.backend = backend, .timeout = std::chrono::milliseconds(60000)})(std::vector<Tensor>{});
}

TrainState load_whole(const std::string& dir) {
  TrainState whole = TrainState::create(gpt().init(Key::from_seed(9)), adam(), Key{});
  load_checkpoint(dir, whole, {});
  return whole;
}

class CheckpointMpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(CheckpointMpiTest, EachProcessWritesItsBlocksAndTheCheckpointReshards) {
  ASSERT_TRUE(comm::backend_available(comm::Backend::Mpi));
  const int rank = world_rank();
  const std::string saved = shared_dir("saved"), again = shared_dir("again");
  if (rank == 0) {
    fs::remove_all(saved);
    fs::remove_all(again);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  run(Mesh({2, 2}, {"data", "model"}), comm::Backend::Mpi, 2, "", saved);
  // Loaded on a 4-way tensor-parallel mesh and saved again, without a step.
  run(Mesh({1, 4}, {"data", "model"}), comm::Backend::Mpi, 0, saved, again);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != 0) return;

  const CheckpointIndex index = read_checkpoint_index(saved);
  EXPECT_EQ(index.meta.step, 2);
  // The devices of data row 0 (0 and 1) hold every distinct block.
  EXPECT_EQ(index.files,
            (std::vector<std::string>{"device_00000.safetensors", "device_00001.safetensors"}));
  const TrainState a = load_whole(saved), b = load_whole(again);
  ASSERT_EQ(a.params.paths(), b.params.paths());
  ASSERT_EQ(a.opt_state.paths(), b.opt_state.paths());
  for (const TensorTree* t : {&a.params, &a.opt_state}) {
    const TensorTree& other = t == &a.params ? b.params : b.opt_state;
    for (const auto& [path, x] : *t)
      EXPECT_EQ(x.to_vector<float>(), other.at(path).to_vector<float>()) << path;
  }
  // The same run on the threads backend in this process: the same arrays, up to the
  // summation order of MPI's reductions.
  const std::string threads = shared_dir("threads");
  fs::remove_all(threads);
  run(Mesh({2, 2}, {"data", "model"}), comm::Backend::Threads, 2, "", threads);
  const TrainState c = load_whole(threads);
  for (const auto& [path, x] : c.params) {
    const auto u = x.to_vector<float>(), v = a.params.at(path).to_vector<float>();
    for (std::size_t i = 0; i < u.size(); ++i)
      ASSERT_NEAR(u[i], v[i], 1e-5 * (1 + std::abs(u[i]))) << path << "[" << i << "]";
  }
  for (const auto& d : {saved, again, threads})
    fs::remove_all(d);
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
