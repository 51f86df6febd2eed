// Ring collectives for asynchronous TP: values and gradients of async_gather /
// async_scatter (both directions, eager, streaming and lazy forms) against all_gather and
// psum_scatter, the overlap of hops with compute (forward and backward) under a slow link
// model, the hop count of the bidirectional ring, bytes moved, and argument errors.
#include "distjax/parallel/tp_async.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <numeric>
#include <thread>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using distjax::testing::expect_close;
using distjax::testing::random_tensor;
using mesh::P;
using parallel::RingChunk;
using parallel::RingGather;
using parallel::RingMode;
using tensor::TensorTree;

namespace {

using Clock = std::chrono::steady_clock;

// Ring order sums differ from all_gather's transpose / psum_scatter's rank order by rounding.
constexpr double kSumTol = 1e-5;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct MeshCase {
  Mesh mesh;
  std::string axis;  // the ring runs along it
};

// 1, 2, 3, 4 and 8 devices on a line, and the model axis of a ("data"=2, "model"=4) mesh.
std::vector<MeshCase> ring_meshes() {
  return {{Mesh::line(1), "data"},       {Mesh::line(2), "data"},
          {Mesh::line(3), "data"},       {Mesh::line(4), "data"},
          {Mesh({8}, {"data"}), "data"}, {Mesh({2, 4}, {"data", "model"}), "model"}};
}

// Runs fn on every device of m (no inputs, no outputs).
void on_devices(const Mesh& m, const std::function<void(DeviceContext&)>& fn,
                const ShardMapOptions& o = {}) {
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        fn(ctx);
        return std::vector<Tensor>{};
      },
      {}, {}, o);
  f(std::vector<Tensor>{});
}

// A per-device random tensor, varying over every mesh axis.
Tensor device_tensor(DeviceContext& ctx, std::uint64_t seed, const Shape& shape) {
  const Axes all(ctx.mesh().axis_names());
  return pvary(ctx, random_tensor(Key::from_seed(seed).fold_in(ctx.device()), shape), all);
}

// This device's partials for the n blocks, each (2, c).
std::vector<Tensor> device_partials(DeviceContext& ctx, int n, std::int64_t c,
                                    std::uint64_t seed = 11) {
  std::vector<Tensor> p;
  for (int j = 0; j < n; ++j)
    p.push_back(device_tensor(ctx, seed + 100 * j, {2, c}));
  return p;
}

// Name of partial j in a TensorTree. (Built with +=: GCC 12 gives a false -Wrestrict on
// "p" + std::to_string(j).)
std::string leaf(int j) {
  std::string name = "p";
  name += std::to_string(j);
  return name;
}

bool varies_over(DeviceContext& ctx, const Tensor& t, const std::string& axis) {
  return (t.varying_axes() & ctx.axis_mask(axis)) != 0;
}

TEST(RingGatherSources, UnidirectionalAndBidirectionalOrders) {
  using parallel::ring_gather_sources;
  EXPECT_EQ(ring_gather_sources(1, 4, RingMode::Unidirectional), (std::vector<int>{1, 0, 3, 2}));
  EXPECT_EQ(ring_gather_sources(1, 4, RingMode::Bidirectional), (std::vector<int>{1, 0, 2, 3}));
  EXPECT_EQ(ring_gather_sources(0, 5, RingMode::Bidirectional), (std::vector<int>{0, 4, 1, 3, 2}));
  EXPECT_EQ(ring_gather_sources(0, 1, RingMode::Bidirectional), (std::vector<int>{0}));
  for (int n = 1; n <= 8; ++n)
    for (int d = 0; d < n; ++d)
      for (RingMode mode : {RingMode::Unidirectional, RingMode::Bidirectional}) {
        std::vector<int> s = parallel::ring_gather_sources(d, n, mode);
        std::sort(s.begin(), s.end());
        std::vector<int> all(n);
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(s, all) << "n=" << n << " d=" << d;
      }
}

TEST(AsyncGather, EqualsAllGatherReorderedOnEveryMesh) {
  for (const MeshCase& mc : ring_meshes()) {
    SCOPED_TRACE(mc.mesh.describe());
    on_devices(mc.mesh, [&](DeviceContext& ctx) {
      const int n = ctx.axis_size(mc.axis), d = ctx.axis_index(mc.axis);
      const Tensor x = device_tensor(ctx, 3, {2, 3});
      const Tensor ref = all_gather(ctx, x, mc.axis);  // (n, 2, 3), block i from device i
      auto expect_chunks = [&](const std::vector<Tensor>& chunks, RingMode mode) {
        ASSERT_EQ(static_cast<int>(chunks.size()), n);
        const std::vector<int> src = parallel::ring_gather_sources(d, n, mode);
        for (int k = 0; k < n; ++k) {
          Tensor want = tensor::reshape(tensor::slice(ref, 0, src[k], src[k] + 1), {2, 3});
          EXPECT_EQ(chunks[k].to_vector<float>(), want.to_vector<float>())
              << "chunk " << k << " on device " << ctx.device();
          EXPECT_EQ(chunks[k].varying_axes(), x.varying_axes());
        }
      };
      expect_chunks(parallel::async_gather(ctx, x, mc.axis), RingMode::Unidirectional);
      expect_chunks(parallel::async_gather_bidirectional(ctx, x, mc.axis), RingMode::Bidirectional);
      // The streaming form gives each chunk its source.
      for (RingMode mode : {RingMode::Unidirectional, RingMode::Bidirectional}) {
        RingGather ring(ctx, x, mc.axis, mode);
        EXPECT_EQ(ring.size(), n);
        std::vector<int> seen;
        while (ring.has_next()) {
          RingChunk c = ring.next();
          seen.push_back(c.source);
          Tensor want = tensor::reshape(tensor::slice(ref, 0, c.source, c.source + 1), {2, 3});
          EXPECT_EQ(c.value.to_vector<float>(), want.to_vector<float>());
        }
        EXPECT_EQ(seen, parallel::ring_gather_sources(d, n, mode));
        EXPECT_THROW(ring.next(), InvalidArgument);
      }
    });
  }
}

TEST(AsyncGather, AReplicatedInputGivesChunksThatVaryOverTheAxis) {
  on_devices(Mesh({2, 4}, {"data", "model"}), [](DeviceContext& ctx) {
    const Tensor w = Tensor::full({3}, 2.0);  // replicated everywhere
    for (const Tensor& c : parallel::async_gather(ctx, w, "model")) {
      EXPECT_TRUE(varies_over(ctx, c, "model"));
      EXPECT_FALSE(varies_over(ctx, c, "data"));
      EXPECT_EQ(c.to_vector<float>(), std::vector<float>(3, 2.f));
    }
    for (const Tensor& c : parallel::async_gather_bidirectional(ctx, w, "model"))
      EXPECT_TRUE(varies_over(ctx, c, "model"));
  });
}

TEST(AsyncScatter, EqualsPsumScatterOnEveryMesh) {
  for (const MeshCase& mc : ring_meshes()) {
    SCOPED_TRACE(mc.mesh.describe());
    on_devices(mc.mesh, [&](DeviceContext& ctx) {
      const int n = ctx.axis_size(mc.axis);
      for (std::int64_t c : {4, 5}) {  // 5: halves of 2 and 3 columns
        const std::vector<Tensor> parts = device_partials(ctx, n, c);
        const Tensor ref = psum_scatter(ctx, tensor::concat(parts, 0), mc.axis, 0, true);
        const Tensor uni = parallel::async_scatter(ctx, parts, mc.axis);
        const Tensor bi = parallel::async_scatter_bidirectional(ctx, parts, mc.axis);
        expect_close(uni, ref, kSumTol, "async_scatter");
        expect_close(bi, ref, kSumTol, "async_scatter_bidirectional");
        EXPECT_TRUE(varies_over(ctx, uni, mc.axis));
        EXPECT_TRUE(varies_over(ctx, bi, mc.axis));
      }
      // Small integers add exactly in any order: equal to the bit.
      std::vector<Tensor> ints;
      for (int j = 0; j < n; ++j)
        ints.push_back(pvary(ctx, Tensor::full({2, 4}, 10.0 * ctx.device() + j), mc.axis));
      const Tensor ref = psum_scatter(ctx, tensor::concat(ints, 0), mc.axis, 0, true);
      EXPECT_EQ(parallel::async_scatter(ctx, ints, mc.axis).to_vector<float>(),
                ref.to_vector<float>());
      EXPECT_EQ(parallel::async_scatter_bidirectional(ctx, ints, mc.axis).to_vector<float>(),
                ref.to_vector<float>());
    });
  }
}

TEST(AsyncScatter, LazyPartialsAreComputedOnceInRingOrder) {
  on_devices(Mesh::line(4), [](DeviceContext& ctx) {
    const int n = 4, d = ctx.axis_index("data");
    const std::vector<Tensor> parts = device_partials(ctx, n, 4);
    const Tensor ref_uni = parallel::async_scatter(ctx, parts, "data");
    const Tensor ref_bi = parallel::async_scatter_bidirectional(ctx, parts, "data");
    std::vector<int> order;
    auto lazy = [&](int j) {
      order.push_back(j);
      return parts[j];
    };
    Tensor uni = parallel::async_scatter(ctx, lazy, "data");
    EXPECT_EQ(order, (std::vector<int>{(d + 1) % n, (d + 2) % n, (d + 3) % n, d}));
    EXPECT_EQ(uni.to_vector<float>(), ref_uni.to_vector<float>());
    order.clear();
    Tensor bi = parallel::async_scatter(ctx, lazy, "data", RingMode::Bidirectional);
    EXPECT_EQ(order, (std::vector<int>{(d + 1) % n, (d + 3) % n, (d + 2) % n, d}));
    EXPECT_EQ(bi.to_vector<float>(), ref_bi.to_vector<float>());
  });
}

// ---------------------------------------------------------------------------- gradients

TEST(AsyncGather, GradientsEqualThoseThroughAllGather) {
  // L = sum over chunks of sum(w_source * chunk^2), w per device and source: the gradient
  // of x_d collects 2 x_d w_d from every device, so it checks the routing of every
  // cotangent back to its source.
  for (const MeshCase& mc : ring_meshes()) {
    SCOPED_TRACE(mc.mesh.describe());
    on_devices(mc.mesh, [&](DeviceContext& ctx) {
      const int n = ctx.axis_size(mc.axis), d = ctx.axis_index(mc.axis);
      std::vector<Tensor> w;
      for (int s = 0; s < n; ++s)
        w.push_back(device_tensor(ctx, 50 + s, {2, 3}));
      auto term = [&](const Tensor& chunk, int source) {
        return tensor::sum(tensor::mul(w[source], tensor::square(chunk)));
      };
      TensorTree p;
      p.set("x", device_tensor(ctx, 5, {2, 3}));
      auto [ref_loss, ref_g] = autodiff::value_and_grad([&](const TensorTree& t) {
        const Tensor all = all_gather(ctx, t.at("x"), mc.axis);
        Tensor l = Tensor::scalar(0.0);
        for (int s = 0; s < n; ++s)
          l = tensor::add(l, term(tensor::reshape(tensor::slice(all, 0, s, s + 1), {2, 3}), s));
        return l;
      })(p);
      for (RingMode mode : {RingMode::Unidirectional, RingMode::Bidirectional}) {
        auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
          const std::vector<Tensor> chunks =
              mode == RingMode::Unidirectional
                  ? parallel::async_gather(ctx, t.at("x"), mc.axis)
                  : parallel::async_gather_bidirectional(ctx, t.at("x"), mc.axis);
          const std::vector<int> src = parallel::ring_gather_sources(d, n, mode);
          Tensor l = Tensor::scalar(0.0);
          for (int k = 0; k < n; ++k)
            l = tensor::add(l, term(chunks[k], src[k]));
          return l;
        })(p);
        expect_close(loss, ref_loss, kSumTol, "loss");
        expect_close(g.at("x"), ref_g.at("x"), kSumTol, "grad of x");
        EXPECT_EQ(g.at("x").varying_axes(), ref_g.at("x").varying_axes());
      }
    });
  }
}

TEST(AsyncScatter, GradientsEqualThoseThroughPsumScatter) {
  // L = sum(v * y^2) with y the scattered block and v per device: every partial's
  // gradient is 2 v_j y_j of the device j owning its block.
  for (const MeshCase& mc : ring_meshes()) {
    SCOPED_TRACE(mc.mesh.describe());
    on_devices(mc.mesh, [&](DeviceContext& ctx) {
      const int n = ctx.axis_size(mc.axis);
      const Tensor v = device_tensor(ctx, 70, {2, 4});
      TensorTree p;
      const std::vector<Tensor> parts = device_partials(ctx, n, 4);
      for (int j = 0; j < n; ++j)
        p.set(leaf(j), parts[j]);
      auto leaves = [n](const TensorTree& t) {
        std::vector<Tensor> xs;
        for (int j = 0; j < n; ++j)
          xs.push_back(t.at(leaf(j)));
        return xs;
      };
      auto objective = [&](const Tensor& y) {
        return tensor::sum(tensor::mul(v, tensor::square(y)));
      };
      auto [ref_loss, ref_g] = autodiff::value_and_grad([&](const TensorTree& t) {
        return objective(psum_scatter(ctx, tensor::concat(leaves(t), 0), mc.axis, 0, true));
      })(p);
      for (RingMode mode : {RingMode::Unidirectional, RingMode::Bidirectional}) {
        auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
          return objective(mode == RingMode::Unidirectional
                               ? parallel::async_scatter(ctx, leaves(t), mc.axis)
                               : parallel::async_scatter_bidirectional(ctx, leaves(t), mc.axis));
        })(p);
        expect_close(loss, ref_loss, kSumTol, "loss");
        for (int j = 0; j < n; ++j)
          expect_close(g.at(leaf(j)), ref_g.at(leaf(j)), kSumTol, "grad of " + leaf(j));
      }
    });
  }
}

// ---------------------------------------------------------------------------- overlap

// ~50 ms of "compute" on a chunk.
void compute(const Tensor&) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// A link on which one 512 KiB hop takes ~52 ms, like the compute on one chunk.
ShardMapOptions slow_link() {
  ShardMapOptions o;
  o.link = {.latency_us = 0, .bandwidth_gbps = 0.01};
  return o;
}

TEST(AsyncGather, PerChunkComputeOverlapsTheHops) {
  // 4 devices: gather-then-compute ~ 3 hops + 4 computes ~ 360 ms; the ring hides the hops
  // behind the compute: ~ 50 + 3 * 52 ~ 210 ms (0.6x). A ring that completes each hop
  // before handing out the chunk it overlaps takes ~ 310 ms (0.85x) and fails.
  std::mutex mu;
  double serial = 0, uni = 0, bi = 0;
  on_devices(
      Mesh::line(4),
      [&](DeviceContext& ctx) {
        const Tensor x = pvary(ctx, Tensor::ones({128 * 1024}), "data");  // 512 KiB
        auto t0 = Clock::now();
        const Tensor all = all_gather(ctx, x, "data");
        for (int s = 0; s < 4; ++s)
          compute(tensor::slice(all, 0, s, s + 1));
        const double t_serial = ms_since(t0);
        t0 = Clock::now();
        parallel::async_gather_apply(ctx, x, "data", [](const Tensor& c, int) { compute(c); });
        const double t_uni = ms_since(t0);
        t0 = Clock::now();
        parallel::async_gather_apply(
            ctx, x, "data", [](const Tensor& c, int) { compute(c); }, RingMode::Bidirectional);
        const double t_bi = ms_since(t0);
        std::lock_guard<std::mutex> lock(mu);
        serial = std::max(serial, t_serial);
        uni = std::max(uni, t_uni);
        bi = std::max(bi, t_bi);
      },
      slow_link());
  EXPECT_GT(serial, 320.0);
  EXPECT_LT(uni, 0.75 * serial) << "ring gather hops did not overlap the compute (" << uni
                                << " ms vs " << serial << " ms serial)";
  EXPECT_LT(bi, 0.75 * serial) << "bidirectional gather hops did not overlap the compute (" << bi
                               << " ms vs " << serial << " ms serial)";
}

TEST(AsyncScatter, LazyPartialsOverlapTheHops) {
  // Compute the 4 partials, then psum_scatter (~ 200 + 157 ms), against the ring computing
  // each partial while the previous accumulator travels (~ 50 + 3 * 52 ms, 0.6x; computing
  // it after the hop instead gives 1.0x).
  std::mutex mu;
  double serial = 0, uni = 0;
  on_devices(
      Mesh::line(4),
      [&](DeviceContext& ctx) {
        const Tensor block = pvary(ctx, Tensor::ones({128 * 1024}), "data");  // 512 KiB
        auto partial = [&](int) {
          compute(block);
          return block;
        };
        auto t0 = Clock::now();
        std::vector<Tensor> parts;
        for (int j = 0; j < 4; ++j)
          parts.push_back(partial(j));
        const Tensor ref = psum_scatter(ctx, tensor::concat(parts, 0), "data", 0, true);
        const double t_serial = ms_since(t0);
        t0 = Clock::now();
        const Tensor y = parallel::async_scatter(ctx, partial, "data");
        const double t_uni = ms_since(t0);
        EXPECT_EQ(y.to_vector<float>(), ref.to_vector<float>());
        std::lock_guard<std::mutex> lock(mu);
        serial = std::max(serial, t_serial);
        uni = std::max(uni, t_uni);
      },
      slow_link());
  EXPECT_GT(serial, 320.0);
  EXPECT_LT(uni, 0.75 * serial) << "ring scatter hops did not overlap the partials (" << uni
                                << " ms vs " << serial << " ms serial)";
}

TEST(AsyncGather, TheBackwardRingOverlapsTheBackwardOfTheCompute) {
  // Per chunk, an identity whose backward takes ~ 50 ms. Backward through all_gather:
  // 4 x 50 ms, then the psum_scatter of the cotangents (~ 157 ms); through the ring, each
  // chunk's cotangent leaves as soon as its backward is done (~ 50 + 3 * 52 ms).
  auto slow_backward = [](const Tensor& x) {
    return autodiff::custom_vjp1(
        "slow_backward", {x},
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].clone()}; },
        [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return std::vector<Tensor>{g[0]};
        });
  };
  std::mutex mu;
  double serial = 0, ring = 0;
  on_devices(
      Mesh::line(4),
      [&](DeviceContext& ctx) {
        TensorTree p;
        p.set("x", pvary(ctx, Tensor::ones({128 * 1024}), "data"));  // 512 KiB
        // Forward time is excluded: stamp the end of each forward, time to the end of grad.
        Clock::time_point fwd_end;
        auto backward_ms = [&](const std::function<Tensor(const Tensor&)>& f) {
          auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
            Tensor l = f(t.at("x"));
            fwd_end = Clock::now();
            return l;
          })(p);
          EXPECT_EQ(g.at("x").to_vector<float>()[5], 4.f);  // one per device
          return ms_since(fwd_end);
        };
        const double t_serial = backward_ms([&](const Tensor& x) {
          const Tensor all = all_gather(ctx, x, "data", 0, true);
          Tensor l = Tensor::scalar(0.0);
          for (int s = 0; s < 4; ++s)
            l = tensor::add(l, tensor::sum(slow_backward(
                                   tensor::slice(all, 0, s * 128 * 1024, (s + 1) * 128 * 1024))));
          return l;
        });
        const double t_ring = backward_ms([&](const Tensor& x) {
          Tensor l = Tensor::scalar(0.0);
          parallel::async_gather_apply(ctx, x, "data", [&](const Tensor& c, int) {
            l = tensor::add(l, tensor::sum(slow_backward(c)));
          });
          return l;
        });
        std::lock_guard<std::mutex> lock(mu);
        serial = std::max(serial, t_serial);
        ring = std::max(ring, t_ring);
      },
      slow_link());
  EXPECT_GT(serial, 320.0);
  EXPECT_LT(ring, 0.75 * serial) << "backward ring hops did not overlap the backward compute ("
                                 << ring << " ms vs " << serial << " ms serial)";
}

TEST(AsyncGather, BidirectionalTakesAboutHalfTheHops) {
  // 8 devices, one 256 KiB hop ~ 26 ms: 7 hops one way, 4 in each direction at once.
  std::mutex mu;
  double uni = 0, bi = 0;
  on_devices(
      Mesh::line(8),
      [&](DeviceContext& ctx) {
        const Tensor x = pvary(ctx, Tensor::ones({64 * 1024}), "data");
        auto t0 = Clock::now();
        parallel::async_gather(ctx, x, "data");
        const double t_uni = ms_since(t0);
        t0 = Clock::now();
        parallel::async_gather_bidirectional(ctx, x, "data");
        const double t_bi = ms_since(t0);
        std::lock_guard<std::mutex> lock(mu);
        uni = std::max(uni, t_uni);
        bi = std::max(bi, t_bi);
      },
      slow_link());
  EXPECT_GT(uni, 160.0);
  EXPECT_LT(bi, 0.75 * uni) << bi << " ms bidirectional vs " << uni << " ms one way";
}

// ---------------------------------------------------------------------- bytes and errors

TEST(TpAsync, AnAxisOfOneDeviceMovesNoBytes) {
  on_devices(Mesh({2, 1}, {"data", "model"}), [](DeviceContext& ctx) {
    ctx.comm_stats().reset();
    ctx.counters().collective_calls.clear();
    TensorTree p;
    p.set("x", device_tensor(ctx, 1, {2, 4}));
    auto g = autodiff::grad([&](const TensorTree& t) {
      const Tensor x = t.at("x");
      std::vector<Tensor> a = parallel::async_gather(ctx, x, "model");
      std::vector<Tensor> b = parallel::async_gather_bidirectional(ctx, x, "model");
      EXPECT_EQ(a.size(), 1u);
      EXPECT_EQ(b.size(), 1u);
      EXPECT_EQ(a[0].to_vector<float>(), x.to_vector<float>());
      Tensor y = parallel::async_scatter(ctx, {x}, "model");
      Tensor z = parallel::async_scatter_bidirectional(ctx, {x}, "model");
      EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
      EXPECT_EQ(z.to_vector<float>(), x.to_vector<float>());
      return tensor::sum(tensor::add(tensor::add(a[0], b[0]), tensor::add(y, z)));
    })(p);
    EXPECT_EQ(g.at("x").to_vector<float>(), std::vector<float>(8, 4.f));
    EXPECT_EQ(ctx.comm_stats().total_bytes_sent(), 0);
    EXPECT_EQ(ctx.comm_stats().total_bytes_received(), 0);
    EXPECT_EQ(ctx.counters().collective_calls.count("ppermute"), 0u);
  });
}

TEST(TpAsync, RingsMoveTheBytesOfAllGatherAndReduceScatter) {
  // (n-1) blocks sent and received per device (both directions together), as
  // all_gather and reduce_scatter count them; nothing else (isend / irecv only).
  on_devices(Mesh({2, 4}, {"data", "model"}), [](DeviceContext& ctx) {
    const std::int64_t block = 2 * 4 * 4;  // (2, 4) f32
    const Tensor x = device_tensor(ctx, 1, {2, 4});
    const std::vector<Tensor> parts = device_partials(ctx, 4, 4);
    auto bytes_moved = [&](const std::function<void()>& f) {
      ctx.comm_stats().reset();
      f();
      return std::pair{ctx.comm_stats().total_bytes_sent(),
                       ctx.comm_stats().total_bytes_received()};
    };
    const std::pair expected{3 * block, 3 * block};
    EXPECT_EQ(bytes_moved([&] { parallel::async_gather(ctx, x, "model"); }), expected);
    EXPECT_EQ(bytes_moved([&] { parallel::async_gather_bidirectional(ctx, x, "model"); }),
              expected);
    EXPECT_EQ(bytes_moved([&] { parallel::async_scatter(ctx, parts, "model"); }), expected);
    EXPECT_EQ(bytes_moved([&] { parallel::async_scatter_bidirectional(ctx, parts, "model"); }),
              expected);
  });
}

TEST(TpAsync, BadArgumentsAreErrorsNamingTheOp) {
  on_devices(Mesh({2, 4}, {"data", "model"}), [](DeviceContext& ctx) {
    auto message = [](const std::function<void()>& f) -> std::string {
      try {
        f();
      } catch (const InvalidArgument& e) {
        return e.what();
      }
      return "<no InvalidArgument>";
    };
    const std::vector<Tensor> three(3, Tensor::ones({2, 4}));
    EXPECT_NE(message([&] { parallel::async_scatter(ctx, three, "model"); })
                  .find("[async_scatter] expected 4 partials (one per device along \"model\"), "
                        "got 3"),
              std::string::npos);
    EXPECT_NE(message([&] {
                parallel::async_scatter_bidirectional(ctx, three, "model");
              }).find("[async_scatter_bidirectional] expected 4 partials"),
              std::string::npos);
    std::vector<Tensor> mixed(4, Tensor::ones({2, 4}));
    mixed[2] = Tensor::ones({2, 5});
    EXPECT_NE(
        message([&] { parallel::async_scatter(ctx, mixed, "model"); }).find("partial 2 is (2, 5)"),
        std::string::npos)
        << message([&] { parallel::async_scatter(ctx, mixed, "model"); });
    const std::vector<Tensor> narrow(4, Tensor::ones({2, 1}));
    EXPECT_NE(message([&] {
                parallel::async_scatter_bidirectional(ctx, narrow, "model");
              }).find("[async_scatter_bidirectional] partials are split in two"),
              std::string::npos);
    EXPECT_THROW({ RingGather ring(ctx, Tensor(), "model"); }, InvalidArgument);
  });
}

}  // namespace
