// Tensor parallelism under `mpirun -np 4` (MPI backend, one device per process) on a
// ("data"=2, "model"=2) mesh: the Megatron (sequence and vocabulary parallel) and async
// layouts of the GPT train 5 steps to the losses and gradient norms of the same model on
// one device, computed in each process.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "distjax/models/transformer.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/train_step.hpp"

using namespace distjax;
using mesh::Mesh;
using models::TransformerTP;
using parallel::TPLayout;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

constexpr int kSteps = 5;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

models::TransformerConfig tiny_gpt(TransformerTP tp) {
  return {.vocab = 32,
          .d_model = 16,
          .num_layers = 2,
          .num_heads = 4,
          .mlp_ratio = 2,
          .max_len = 8,
          .tp = tp};
}

train::Batch batch(int step) {
  Key k = Key::from_seed(11).fold_in(static_cast<std::uint64_t>(step));
  // Filled on the host, then copied to the current device (DISTJAX_DEVICE).
  std::vector<std::int32_t> x(32), y(32);
  for (std::int64_t i = 0; i < 32; ++i) {
    x[i] = static_cast<std::int32_t>(k.bits(i)[0] % 32);
    y[i] = static_cast<std::int32_t>(k.bits(i)[1] % 32);
  }
  return {Tensor::from_vector(x, {4, 8}), Tensor::from_vector(y, {4, 8})};
}

const optim::SGD& sgd() {
  static const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  return opt;
}

struct TrainingRun {
  std::vector<double> losses, norms;
};

train::LossFn loss_of(const models::Transformer& model, spmd::DeviceContext* ctx) {
  return [&model, ctx](const TensorTree& p, const train::Batch& b, Key k) {
    nn::Scope s = nn::Scope::apply(&p, true, k);
    if (ctx) s = s.on(*ctx);
    return std::make_pair(model.loss(s, b.inputs, b.labels), train::Metrics{});
  };
}

TrainingRun one_device(const models::Transformer& model) {
  auto state = train::TrainState::create(model.init(Key::from_seed(1)), sgd(), Key::from_seed(2));
  TrainingRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto m =
        train::train_step(state, batch(s), loss_of(model, nullptr), sgd(), {.max_grad_norm = 0.5});
    run.losses.push_back(m.mean("loss"));
    run.norms.push_back(m.mean("grad_norm"));
  }
  return run;
}

TrainingRun on_mpi(const models::Transformer& model) {
  TrainingRun run;
  auto f = spmd::shard_map(
      Mesh({2, 2}, {"data", "model"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        auto state = train::TrainState::create(model.init(Key::from_seed(1), &specs, &ctx), sgd(),
                                               Key::from_seed(2));
        parallel::DataParallel dp(ctx, "data", &specs);
        const int i = ctx.axis_index("data");
        for (int s = 0; s < kSteps; ++s) {
          auto m = train::train_step(state, batch(s).slice(2 * i, 2 * i + 2), loss_of(model, &ctx),
                                     sgd(), {.max_grad_norm = 0.5, .strategy = &dp});
          run.losses.push_back(m.mean("loss"));
          run.norms.push_back(m.mean("grad_norm"));
        }
        return std::vector<Tensor>{};
      },
      {}, {}, {.backend = comm::Backend::Mpi, .timeout = std::chrono::milliseconds(60000)});
  f(std::vector<Tensor>{});
  return run;
}

class TensorParallelMpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(TensorParallelMpiTest, GptLayoutsMatchOneDevice) {
  ASSERT_TRUE(comm::backend_available(comm::Backend::Mpi));
  const TrainingRun want = one_device(models::Transformer(tiny_gpt({})));
  for (const TransformerTP& tp :
       {TransformerTP{.layout = TPLayout::Megatron},
        TransformerTP{
            .layout = TPLayout::Megatron, .sequence_parallel = true, .vocab_parallel = true},
        TransformerTP{.layout = TPLayout::Async},
        TransformerTP{.layout = TPLayout::Async, .bidirectional = true}}) {
    const TrainingRun got = on_mpi(models::Transformer(tiny_gpt(tp)));
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s])
          << parallel::tp_layout_name(tp.layout) << " step " << s << " rank " << world_rank();
      EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s])
          << parallel::tp_layout_name(tp.layout) << " step " << s << " rank " << world_rank();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
