// shard_map and the differentiable collectives under `mpirun -np 4` (MPI backend, one
// device per process): values and gradients equal those of the threads backend run in
// the same process, and a mismatched program fails naming the op and the devices.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using mesh::P;
using tensor::TensorTree;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

using DeviceOp = std::function<Tensor(DeviceContext&, const Tensor&)>;

// Runs op on every device of `m` on a device-specific input; returns per device
// (1, y...) and (1, dloss/dx...) with loss = sum(y * y * w).
std::vector<mesh::ShardedArray> run(const Mesh& m, comm::Backend backend, const Shape& in_shape,
                                    const DeviceOp& op) {
  const P all(m.axis_names());
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        Tensor x =
            distjax::testing::random_tensor(Key::from_seed(5).fold_in(ctx.device()), in_shape);
        Tensor y_out;
        TensorTree p;
        p.set("x", x);
        auto g = autodiff::grad([&](const TensorTree& t) {
          Tensor y = op(ctx, t.at("x"));
          y_out = y.detach();
          Tensor w =
              distjax::testing::random_tensor(Key::from_seed(9).fold_in(ctx.device()), y.shape());
          return tensor::sum(tensor::mul(tensor::mul(y, y), w));
        })(p);
        auto lead = [](const Tensor& t) {
          Shape s = t.shape();
          s.insert(s.begin(), 1);
          return t.view(s);
        };
        return std::vector<Tensor>{lead(y_out), lead(g.at("x"))};
      },
      {}, {all, all}, {.backend = backend, .timeout = std::chrono::milliseconds(20000)});
  return f(std::vector<Tensor>{});
}

class SpmdMpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(SpmdMpiTest, CollectivesMatchTheThreadsBackend) {
  ASSERT_TRUE(comm::backend_available(comm::Backend::Mpi));
  const int r = world_rank();
  struct Case {
    std::string name;
    Shape shape;
    DeviceOp op;
  };
  for (const Mesh& m : {Mesh::line(4), Mesh({2, 2}, {"data", "model"})}) {
    const Axes a0(m.axis_names()[0]);
    const Axes all(m.axis_names());
    std::vector<Case> cases = {
        {"psum", {3}, [&](DeviceContext& c, const Tensor& x) { return psum(c, x, all); }},
        {"pmean", {3}, [&](DeviceContext& c, const Tensor& x) { return pmean(c, x, a0); }},
        {"pmax", {3}, [&](DeviceContext& c, const Tensor& x) { return pmax(c, x, all); }},
        {"all_gather",
         {2, 3},
         [&](DeviceContext& c, const Tensor& x) { return all_gather(c, x, a0, 1, true); }},
        {"psum_scatter",
         {4, 2},
         [&](DeviceContext& c, const Tensor& x) { return psum_scatter(c, x, all, 0, true); }},
        {"ppermute",
         {3},
         [&](DeviceContext& c, const Tensor& x) {
           return ppermute(c, x, all, ring_permutation(c.axis_size(all), 1));
         }},
        {"all_to_all",
         {4, 2},
         [&](DeviceContext& c, const Tensor& x) { return all_to_all(c, x, all, 0, 1); }},
        {"pvary", {3}, [&](DeviceContext& c, const Tensor& x) { return pvary(c, x, a0); }},
        // Device i sends (i + j) % 2 + 1 rows to device j: 6 rows each way on 4 devices,
        // in blocks of 1 and 2 (MPI's variable splits; on the checked device, staged).
        {"ragged_all_to_all",
         {6, 2},
         [&](DeviceContext& c, const Tensor& x) {
           const int n = c.axis_size(all), i = c.axis_index(all);
           std::vector<std::int64_t> counts(n);
           for (int j = 0; j < n; ++j) counts[j] = (i + j) % 2 + 1;
           return ragged_all_to_all(c, x, all, counts, counts, 2);
         }},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE(c.name + " on " + m.describe());
      auto mpi = run(m, comm::Backend::Mpi, c.shape, c.op);
      auto thr = run(m, comm::Backend::Threads, c.shape, c.op);
      ASSERT_TRUE(mpi[0].has_shard(r));
      EXPECT_FALSE(mpi[0].has_shard((r + 1) % 4));  // a process holds its own device only
      for (int k = 0; k < 2; ++k)
        distjax::testing::expect_close(mpi[k].shard(r), thr[k].shard(r), 1e-6,
                                       k == 0 ? "value" : "gradient");
    }
  }
}

TEST_F(SpmdMpiTest, MismatchedProgramFailsNamingOpAndDevices) {
  auto f = shard_map(
      Mesh::line(4),
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        Tensor x = Tensor::ones({4});
        Tensor y = ctx.device() == 1 ? all_gather(ctx, x, "data", 0, true) : psum(ctx, x, "data");
        return std::vector<Tensor>{y};
      },
      {}, {P("data")}, {.backend = comm::Backend::Mpi, .timeout = std::chrono::milliseconds(5000)});
  try {
    f(std::vector<Tensor>{});
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("all_gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("device 1"), std::string::npos) << msg;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
