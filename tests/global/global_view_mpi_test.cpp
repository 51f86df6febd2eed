// The global-view GPT under `mpirun -np 4` (MPI backend, one device per process) on a
// ("data"=2, "model"=2) mesh with the Megatron rules: 5 SGD steps give the losses of
// models::Transformer on one device, computed in each process.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/global_transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"

using namespace distjax;
using global::GlobalArray;
using global::GlobalTree;
using mesh::P;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

constexpr int kSteps = 5;
constexpr double kLr = 0.2;
const models::TransformerConfig kConfig{
    .vocab = 32, .d_model = 16, .num_layers = 2, .num_heads = 4, .mlp_ratio = 2, .max_len = 8};

std::pair<Tensor, Tensor> batch() {
  // Filled on the host, then copied to the current device (DISTJAX_DEVICE).
  std::vector<std::int32_t> x(32), y(32);
  for (std::int32_t i = 0; i < 32; ++i) {
    x[i] = (i * 7) % 32;
    y[i] = (i * 3 + 1) % 32;
  }
  return {Tensor::from_vector(x, {4, 8}), Tensor::from_vector(y, {4, 8})};
}

class GlobalViewMpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(GlobalViewMpiTest, MegatronGptMatchesOneDevice) {
  ASSERT_TRUE(comm::backend_available(comm::Backend::Mpi));
  // Plain variables, not a structured binding: the lambdas below use them, which clang
  // before 16 rejects for a binding.
  const std::pair<Tensor, Tensor> xy = batch();
  const Tensor &x = xy.first, &y = xy.second;
  const models::Transformer gpt(kConfig);
  std::vector<double> want;
  TensorTree p = gpt.init(Key::from_seed(0));
  const TensorTree init = p;
  for (int s = 0; s < kSteps; ++s) {
    auto [loss, g] = autodiff::value_and_grad(
        [&](const TensorTree& q) { return gpt.loss(nn::Scope::apply(&q, false, Key{}), x, y); })(p);
    want.push_back(loss.item<double>());
    for (const auto& path : p.paths())
      p.set(path, tensor::sub(p.at(path), tensor::mul_scalar(g.at(path), kLr)));
  }
  const auto rules = models::transformer_megatron_rules("model");
  std::vector<double> got;
  spmd::shard_map(
      mesh::Mesh({2, 2}, {"data", "model"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        GlobalTree params;
        for (const auto& [path, t] : init)
          params.emplace(path, GlobalArray::from_host(ctx, t, {rules.spec_for(path)}));
        const GlobalArray gx = GlobalArray::from_host(ctx, x, {P("data")});
        const GlobalArray gy = GlobalArray::from_host(ctx, y, {P("data")});
        for (int s = 0; s < kSteps; ++s) {
          auto [loss, grads] = global::value_and_grad(
              [&](const GlobalTree& q) {
                return models::global_transformer_loss(kConfig, q, gx, gy);
              },
              params);
          got.push_back(loss.local().item<double>());
          for (auto& [path, q] : params)
            q = GlobalArray(ctx,
                            tensor::sub(q.local(), tensor::mul_scalar(grads.at(path).local(), kLr)),
                            q.shape(), q.sharding());
        }
        return std::vector<Tensor>{};
      },
      {}, {}, {.backend = comm::Backend::Mpi, .timeout = std::chrono::milliseconds(60000)})(
      std::vector<Tensor>{});
  ASSERT_EQ(got.size(), want.size());
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(got[s], want[s], 1e-5 * want[s]) << "step " << s;
  EXPECT_LT(want.back(), want.front());
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
