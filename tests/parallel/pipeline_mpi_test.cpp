// Pipeline parallelism under `mpirun -np 4` (MPI backend, one device per process): the
// PPClassifier on a ("pipe"=4) mesh under 1F1B and ZB-H1, and on ("data"=2, "pipe"=2)
// under interleaved 1F1B and interleaved zero bubble, trains 5 steps to the losses and
// gradient norms of the whole model on one device, computed in each process.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "distjax/models/pp_classifier.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/train_step.hpp"

using namespace distjax;
using mesh::Mesh;
using parallel::ScheduleKind;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

constexpr int kSteps = 5;

train::Batch batch(int step) {
  Key k = Key::from_seed(5).fold_in(static_cast<std::uint64_t>(step));
  // Filled on the host, then copied to the current device (DISTJAX_DEVICE).
  std::vector<float> x(16 * 12);
  std::vector<std::int32_t> y(16);
  for (std::int64_t i = 0; i < 16 * 12; ++i)
    x[i] = static_cast<float>(k.bits(i)[0] % 1000) / 500.f - 1.f;
  for (std::int64_t i = 0; i < 16; ++i) y[i] = static_cast<std::int32_t>(k.bits(i)[1] % 10);
  return {Tensor::from_vector(x, {16, 12}), Tensor::from_vector(y, {16})};
}

const optim::SGD& sgd() {
  static const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  return opt;
}

struct TrainingRun {
  std::vector<double> losses, norms;
};

const models::PPClassifier& model() {
  static const models::PPClassifier m(
      {.in_features = 12, .hidden = 16, .num_layers = 4, .mlp_expansion = 2, .num_classes = 10});
  return m;
}

TrainingRun one_device() {
  auto state = train::TrainState::create(model().init(Key::from_seed(1)), sgd(), Key::from_seed(2));
  TrainingRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto m = train::train_step(state, batch(s), model().loss_fn(), sgd(), {.max_grad_norm = 0.5});
    run.losses.push_back(m.mean("loss"));
    run.norms.push_back(m.mean("grad_norm"));
  }
  return run;
}

TrainingRun on_mpi(const Mesh& mesh, ScheduleKind kind, int m, int v) {
  TrainingRun run;
  spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        const bool data = mesh.has_axis("data");
        std::unique_ptr<parallel::DataParallel> dp;
        if (data) dp = std::make_unique<parallel::DataParallel>(ctx, "data", &specs);
        parallel::Pipeline pp(ctx, model(), {.schedule = kind, .microbatches = m, .virtual_stages = v},
                              dp.get());
        auto state = train::TrainState::create(
            model().init(Key::from_seed(1), pp.chunks(), pp.num_chunks(), &specs, &ctx), sgd(),
            Key::from_seed(2), pp);
        const int n = data ? ctx.axis_size("data") : 1, i = data ? ctx.axis_index("data") : 0;
        for (int s = 0; s < kSteps; ++s) {
          const std::int64_t per = 16 / n;
          auto mt = train::train_step(state, batch(s).slice(i * per, (i + 1) * per), nullptr, sgd(),
                                      {.max_grad_norm = 0.5, .strategy = &pp});
          run.losses.push_back(mt.mean("loss"));
          run.norms.push_back(mt.mean("grad_norm"));
        }
        return std::vector<Tensor>{};
      },
      {}, {}, {.backend = comm::Backend::Mpi, .timeout = std::chrono::milliseconds(60000)})(
      std::vector<Tensor>{});
  return run;
}

class PipelineMpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(PipelineMpiTest, SchedulesMatchOneDevice) {
  ASSERT_TRUE(comm::backend_available(comm::Backend::Mpi));
  const TrainingRun want = one_device();
  struct Case {
    Mesh mesh;
    ScheduleKind kind;
    int m, v;
  };
  for (const Case& c : {Case{Mesh({4}, {"pipe"}), ScheduleKind::OneFOneB, 8, 1},
                        Case{Mesh({4}, {"pipe"}), ScheduleKind::ZeroBubbleH1, 4, 1},
                        Case{Mesh({2, 2}, {"data", "pipe"}), ScheduleKind::Interleaved1F1B, 4, 2},
                        Case{Mesh({2, 2}, {"data", "pipe"}), ScheduleKind::InterleavedZeroBubble, 4, 2}}) {
    const TrainingRun got = on_mpi(c.mesh, c.kind, c.m, c.v);
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * want.losses[s])
          << parallel::to_string(c.kind) << " step " << s;
      EXPECT_NEAR(got.norms[s], want.norms[s], 1e-5 * want.norms[s])
          << parallel::to_string(c.kind) << " step " << s;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
