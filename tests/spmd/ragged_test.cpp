// The ragged all-to-all, blocking and in two halves: the rows each device receives, two
// exchanges in flight at once completed in the other order, the gradient (the exchange of
// the cotangent back), and bad counts and handles refused.
#include "distjax/spmd/ragged.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using mesh::P;
using tensor::TensorTree;

namespace {

// Rows device i sends device j: 0 to 3 of them, different for every pair.
std::int64_t count(int i, int j) { return (i + 2 * j + 1) % 4; }

// Device i's rows for device j (`which` tells two exchanges apart): row r holds
// which * 1000 + 100 i + 10 j + r in both columns.
std::vector<float> rows_for(int which, int i, int j) {
  std::vector<float> v;
  for (std::int64_t r = 0; r < count(i, j); ++r)
    for (int col = 0; col < 2; ++col) v.push_back(float(which * 1000 + 100 * i + 10 * j + r));
  return v;
}

struct Exchange {
  std::vector<std::int64_t> send, recv;
  std::int64_t block = 0;
  Tensor x;  // (sum send, 2)
};

Exchange exchange_of(int which, int me, int n) {
  Exchange e;
  std::vector<float> v;
  for (int j = 0; j < n; ++j) {
    e.send.push_back(count(me, j));
    e.recv.push_back(count(j, me));
    const std::vector<float> r = rows_for(which, me, j);
    v.insert(v.end(), r.begin(), r.end());
    for (int i = 0; i < n; ++i) e.block = std::max(e.block, count(i, j));
  }
  e.x = Tensor::from_vector(v, {std::int64_t(v.size() / 2), 2});
  return e;
}

// What device `me` should receive: every device's rows for it, in device order.
std::vector<float> expected(int which, int me, int n) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> r = rows_for(which, i, me);
    v.insert(v.end(), r.begin(), r.end());
  }
  return v;
}

void on_devices(int n, const std::function<void(DeviceContext&)>& fn) {
  shard_map(
      Mesh::line(n),
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        fn(ctx);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
}

TEST(RaggedAllToAll, EachDeviceReceivesItsRowsInDeviceOrder) {
  for (int n : {1, 2, 4}) {
    on_devices(n, [&](DeviceContext& ctx) {
      const int me = ctx.axis_index("data");
      const Exchange e = exchange_of(0, me, n);
      const Tensor got = ragged_all_to_all(ctx, e.x, "data", e.send, e.recv, e.block);
      EXPECT_EQ(got.to_vector<float>(), expected(0, me, n)) << n << " devices, device " << me;
      EXPECT_EQ(ctx.varying_axes(got), Axes("data"));
    });
  }
}

// Two exchanges started before either completes, completed in the other order; the loss
// sum(a^2) / 2 + 3 sum(b) makes each row's gradient on its sender its own value (the
// exchange back of the receiver's cotangent a) and 3.
TEST(RaggedAllToAll, TwoInFlightCompleteInAnyOrderWithTheirGradients) {
  const int n = 4;
  on_devices(n, [&](DeviceContext& ctx) {
    const int me = ctx.axis_index("data");
    const Exchange e0 = exchange_of(0, me, n), e1 = exchange_of(1, me, n);
    TensorTree p;
    p.set("x0", pvary(ctx, e0.x, "data"));
    p.set("x1", pvary(ctx, e1.x, "data"));
    Tensor a, b;
    auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
      RaggedHandle h0 = ragged_all_to_all_start(ctx, t.at("x0"), "data", e0.send, e0.recv, e0.block);
      RaggedHandle h1 = ragged_all_to_all_start(ctx, t.at("x1"), "data", e1.send, e1.recv, e1.block);
      const Tensor got1 = ragged_all_to_all_done(h1);
      const Tensor got0 = ragged_all_to_all_done(h0);
      a = got0.detach();
      b = got1.detach();
      return tensor::add(tensor::mul_scalar(tensor::sum(tensor::square(got0)), 0.5),
                         tensor::mul_scalar(tensor::sum(got1), 3.0));
    })(p);
    EXPECT_EQ(a.to_vector<float>(), expected(0, me, n)) << "device " << me;
    EXPECT_EQ(b.to_vector<float>(), expected(1, me, n)) << "device " << me;
    EXPECT_EQ(g.at("x0").to_vector<float>(), e0.x.to_vector<float>()) << "device " << me;
    EXPECT_EQ(g.at("x1").to_vector<float>(),
              std::vector<float>(std::size_t(e1.x.numel()), 3.f))
        << "device " << me;
  });
}

TEST(RaggedAllToAll, BadCountsAndHandlesAreRefused) {
  on_devices(2, [&](DeviceContext& ctx) {
    const Tensor x = Tensor::zeros({3, 2});
    // Counts that do not add to the rows, over the block, or one per device missing.
    EXPECT_THROW(ragged_all_to_all(ctx, x, "data", {1, 1}, {1, 1}, 2), InvalidArgument);
    EXPECT_THROW(ragged_all_to_all(ctx, x, "data", {3, 0}, {1, 1}, 2), InvalidArgument);
    EXPECT_THROW(ragged_all_to_all(ctx, x, "data", {3}, {3}, 3), InvalidArgument);
    RaggedHandle h;
    EXPECT_THROW(ragged_all_to_all_done(h), InvalidArgument);
  });
}

}  // namespace
