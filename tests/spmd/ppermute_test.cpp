// Asynchronous ppermute: values and gradients of start/done with compute in between,
// pairwise transfers that leave devices outside the permutation free, overlap of the
// transfer with compute, and the asynchronous backward.
#include "distjax/spmd/ppermute.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using mesh::P;
using tensor::TensorTree;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

TEST(Ppermute, StartDoneWithComputeBetweenMatchesTheRingShiftAndItsGradient) {
  // Device i holds x_i = (i+1) * ones(3); it sends along the ring and multiplies what it
  // receives by w_i = i + 1, while computing sum(x_i^2) in between. Objective: the sum over
  // devices of sum(w_i * x_{i-1}) + sum(x_i^2). d/dx_i = w_{i+1} + 2 x_i.
  const int n = 4;
  Mesh m = Mesh::line(n);
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const int i = ctx.axis_index("data");
        TensorTree p;
        p.set("x", pvary(ctx, Tensor::full({3}, i + 1.0), "data"));
        Tensor received;
        auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
          PermuteHandle h = ppermute_start(ctx, t.at("x"), "data", ring_permutation(n));
          Tensor own = tensor::sum(tensor::square(t.at("x")));  // overlaps the transfer
          Tensor y = ppermute_done(h);
          received = y.detach();
          return tensor::add(own, tensor::sum(tensor::mul_scalar(y, i + 1.0)));
        })(p);
        EXPECT_EQ(ctx.varying_axes(received), Axes("data"));
        return std::vector<Tensor>{received, g.at("x")};
      },
      {}, {P("data"), P("data")});
  auto out = f(std::vector<Tensor>{});
  for (int i = 0; i < n; ++i) {
    const float from = static_cast<float>((i + n - 1) % n + 1);
    EXPECT_EQ(out[0].shard(i).to_vector<float>(), std::vector<float>(3, from)) << "device " << i;
    const float grad = static_cast<float>((i + 1) % n + 1) + 2.f * (i + 1);
    EXPECT_EQ(out[1].shard(i).to_vector<float>(), std::vector<float>(3, grad)) << "device " << i;
  }
}

TEST(Ppermute, DevicesOutsideThePermutationDoNotWait) {
  // Only 0 -> 1 transfers; device 0 starts late. Devices 2 and 3 take part in no pair and
  // must not be held up (a whole-group rendezvous would make them wait for device 0).
  Mesh m = Mesh::line(4);
  std::mutex mu;
  std::vector<double> took(4);
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const int i = ctx.axis_index("data");
        if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const auto t0 = Clock::now();
        Tensor y = ppermute(ctx, Tensor::full({4}, i + 1.0), "data", {{0, 1}});
        std::lock_guard<std::mutex> lock(mu);
        took[i] = ms_since(t0);
        return std::vector<Tensor>{y};
      },
      {}, {P("data")});
  auto out = f(std::vector<Tensor>{});
  EXPECT_EQ(out[0].shard(1).to_vector<float>(), std::vector<float>(4, 1.f));
  EXPECT_EQ(out[0].shard(2).to_vector<float>(), std::vector<float>(4, 0.f));  // received nothing
  EXPECT_GE(took[1], 200.0) << "device 1 must wait for device 0's data";
  EXPECT_LT(took[2], 100.0) << "device 2 is in no pair";
  EXPECT_LT(took[3], 100.0) << "device 3 is in no pair";
}

TEST(Ppermute, TheTransferOverlapsComputeForwardAndBackward) {
  // A link model makes one 1 MiB transfer take ~100 ms. Compute of ~100 ms between start
  // and done hides most of it, in the forward and in the backward pass.
  Mesh m = Mesh::line(2);
  ShardMapOptions o;
  o.link = {.latency_us = 0, .bandwidth_gbps = 0.01};  // 1 MiB / 10 MB/s ~ 105 ms
  std::mutex mu;
  double fwd_overlap = 0, fwd_serial = 0, bwd_total = 0;
  auto sleep_op = [](const Tensor& x) {
    // ~100 ms of "compute" as a differentiable identity whose backward also takes 100 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return autodiff::custom_vjp1(
        "slow", {x}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].clone()}; },
        [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return std::vector<Tensor>{g[0]};
        });
  };
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const Tensor big = pvary(ctx, Tensor::ones({256 * 1024}), "data");  // 1 MiB
        TensorTree p;
        p.set("x", big);
        p.set("z", Tensor::ones({4}));
        // Serial: the transfer, then the compute.
        auto t0 = Clock::now();
        Tensor a = ppermute(ctx, big, "data", ring_permutation(2));
        sleep_op(a);
        const double serial = ms_since(t0);
        // Overlapped, differentiated.
        double forward = 0;
        t0 = Clock::now();
        auto g = autodiff::grad([&](const TensorTree& t) {
          const auto f0 = Clock::now();
          PermuteHandle h = ppermute_start(ctx, t.at("x"), "data", ring_permutation(2));
          Tensor c = sleep_op(t.at("z"));
          Tensor y = ppermute_done(h);
          forward = ms_since(f0);
          return tensor::add(tensor::sum(y), tensor::sum(c));
        })(p);
        const double total = ms_since(t0);
        EXPECT_EQ(g.at("x").to_vector<float>()[7], 1.f);
        std::lock_guard<std::mutex> lock(mu);
        fwd_serial = std::max(fwd_serial, serial);
        fwd_overlap = std::max(fwd_overlap, forward);
        bwd_total = std::max(bwd_total, total - forward);
        return std::vector<Tensor>{};
      },
      {}, {}, o);
  f(std::vector<Tensor>{});
  // Serial ~205 ms; overlapped ~105 ms; the backward (reverse transfer + 100 ms) ~105 ms.
  EXPECT_GT(fwd_serial, 180.0);
  EXPECT_LT(fwd_overlap, 0.8 * fwd_serial) << "forward transfer did not overlap the compute";
  EXPECT_LT(bwd_total, 0.8 * fwd_serial) << "backward transfer did not overlap the compute";
}

TEST(Ppermute, DoneTwiceIsAnErrorAndBadPairsAreShardingErrors) {
  Mesh m = Mesh::line(2);
  auto f = shard_map(
      m,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        PermuteHandle h = ppermute_start(ctx, Tensor::ones({2}), "data", ring_permutation(2));
        ppermute_done(h);
        EXPECT_THROW(ppermute_done(h), InvalidArgument);
        EXPECT_THROW(ppermute_start(ctx, Tensor::ones({2}), "data", {{0, 2}}), ShardingError);
        EXPECT_THROW(ppermute_start(ctx, Tensor::ones({2}), "data", {{0, 1}, {1, 1}}),
                     ShardingError);
        return std::vector<Tensor>{};
      },
      {}, {});
  f(std::vector<Tensor>{});
}

}  // namespace
