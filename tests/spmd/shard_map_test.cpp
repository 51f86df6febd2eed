// shard_map: assembly of outputs, resharding of inputs, the replication check, errors
// of mismatched programs, per-device context (coordinates, rng folding, counters, also
// per mesh axis).
#include "distjax/spmd/shard_map.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using mesh::P;
using tensor::TensorTree;

namespace {

Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, s);
}

template <class E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other exception> ") + e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST(ShardMap, RunsOncePerDeviceOnLocalShardsAndAssemblesOutputs) {
  Mesh m({2, 4}, {"data", "model"});
  Tensor x = iota({4, 8});
  std::atomic<int> calls{0};
  auto f =
      shard_map(m,
                [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
                  ++calls;
                  EXPECT_EQ(in[0].shape(), (Shape{2, 2}));
                  // Local block + 100 * device; a row sum reduced over "model" (replicated there).
                  Tensor local = tensor::add_scalar(in[0], 100.0 * ctx.device());
                  Tensor rows = psum(ctx, tensor::sum(in[0], {1}), "model");
                  return std::vector<Tensor>{local, rows};
                },
                {P("data", "model")}, {P("data", "model"), P("data")}, {.check_replicated = true});
  auto out = f(std::vector<Tensor>{x});
  EXPECT_EQ(calls.load(), 8);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{4, 8}));
  EXPECT_EQ(out[1].shape(), (Shape{4}));
  Tensor g0 = mesh::gather(out[0]);
  // Element (r, c) lives on device (r / 2) * 4 + c / 2.
  std::vector<float> v = g0.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c)
      EXPECT_EQ(v[r * 8 + c], 8 * r + c + 100 * ((r / 2) * 4 + c / 2));
  // Row sums of iota(4, 8): 28, 92, 156, 220.
  EXPECT_EQ(mesh::gather(out[1]).to_vector<float>(), (std::vector<float>{28, 92, 156, 220}));
}

TEST(ShardMap, ReshardsInputsWhoseShardingDiffers) {
  Mesh m({2, 2}, {"data", "model"});
  Tensor x = iota({4, 4});
  auto placed = mesh::device_put(x, NamedSharding(m, P("model", "data")));
  auto f = shard_map(
      m, [](DeviceContext&, const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
      {P("data")}, {P("data")});
  auto out = f({placed});
  EXPECT_EQ(out[0].shard(2).to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(mesh::gather(out[0]).to_vector<float>(), x.to_vector<float>());
}

TEST(ShardMap, SpecErrorsNameTheArgument) {
  Mesh m({4, 2}, {"data", "model"});
  auto f = shard_map(m, [](DeviceContext&, const std::vector<Tensor>& in) { return in; },
                     {P("data", "model")}, {P("data", "model")});
  const std::string msg = error_of<ShardingError>([&] { f(std::vector<Tensor>{iota({6, 4})}); });
  EXPECT_NE(msg.find("argument \"in0\" with shape (6, 4): spec P(\"data\", \"model\")"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("dimension 0 (6) is not divisible by \"data\"=4"), std::string::npos) << msg;
  EXPECT_THROW(shard_map(m, [](DeviceContext&, const std::vector<Tensor>& in) { return in; },
                         {P("pipe")}, {P()}),
               ShardingError);
  // A misspelled axis, in an in_spec or an out_spec, is named before anything runs.
  // in and out are plain variables, not a structured binding: the lambda uses them, which
  // clang before 16 rejects for a binding.
  for (const auto& io : {std::pair{P("modle"), P()}, std::pair{P(), P("modle")}}) {
    const auto &in = io.first, &out = io.second;
    const std::string typo = error_of<ShardingError>([&] {
      shard_map(m, [](DeviceContext&, const std::vector<Tensor>& x) { return x; }, {in}, {out});
    });
    EXPECT_NE(typo.find("\"modle\""), std::string::npos) << typo;
  }
}

TEST(ShardMap, AnOutputVaryingOverAnAxisItsOutSpecLeavesOutIsAnError) {
  Mesh m({2, 4}, {"data", "model"});
  // Declared replicated along "model" but it is the device's own model shard: known from
  // the varying axes alone, before any value is compared.
  auto bad = shard_map(
      m, [](DeviceContext&, const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
      {P("data", "model")}, {P("data")});
  const std::string msg = error_of<ShardingError>([&] { bad(std::vector<Tensor>{iota({4, 8})}); });
  EXPECT_NE(msg.find("output 0 varies over mesh axis \"model\" but its out_spec P(\"data\") "
                     "does not name it"),
            std::string::npos)
      << msg;
  // Through ops: the sum of a model shard and a replicated value still varies.
  auto mixed = shard_map(m,
                         [](DeviceContext&, const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{tensor::add(in[0], in[1])};
                         },
                         {P("data", "model"), P()}, {P("data")});
  EXPECT_THROW(mixed(std::vector<Tensor>{iota({4, 8}), iota({2, 2})}), ShardingError);
  // A psum over "model" makes it replicated.
  auto good = shard_map(m,
                        [](DeviceContext& ctx, const std::vector<Tensor>& in) {
                          return std::vector<Tensor>{psum(ctx, in[0], "model")};
                        },
                        {P("data", "model")}, {P("data")}, {.check_replicated = true});
  EXPECT_NO_THROW(good(std::vector<Tensor>{iota({4, 8})}));
}

TEST(ShardMap, CheckReplicatedCatchesValuesThatDifferAlongAReplicatedAxis) {
  Mesh m({2, 4}, {"data", "model"});
  // A value built from the device's index outside the collectives is not tracked as
  // varying; the debug check compares the values themselves.
  auto fn = [](DeviceContext& ctx, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{Tensor::full(in[0].shape(), ctx.axis_index("model"))};
  };
  auto bad = shard_map(m, fn, {P("data")}, {P("data")}, {.check_replicated = true});
  const std::string msg = error_of<ShardingError>([&] { bad(std::vector<Tensor>{iota({4, 8})}); });
  EXPECT_NE(
      msg.find("output 0 with out_spec P(\"data\") is declared replicated along \"model\" but "
               "differs between devices"),
      std::string::npos)
      << msg;
  // Without the check nothing is compared (the output is assembled from device 0 of each
  // group).
  auto unchecked = shard_map(m, fn, {P("data")}, {P("data")});
  EXPECT_NO_THROW(unchecked(std::vector<Tensor>{iota({4, 8})}));
}

TEST(ShardMap, MismatchedCollectiveFailsFastNamingOpAndDevices) {
  Mesh m = Mesh::line(4);
  auto f = shard_map(m,
                     [](DeviceContext& ctx, const std::vector<Tensor>&) {
                       Tensor x = Tensor::ones({4});
                       Tensor y = ctx.device() == 2 ? all_gather(ctx, x, "data", 0, true)
                                                    : psum(ctx, x, "data");
                       return std::vector<Tensor>{y};
                     },
                     {}, {P("data")}, {.timeout = std::chrono::milliseconds(2000)});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<CommError>([&] { f(std::vector<Tensor>{}); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 3.0) << msg;
  EXPECT_NE(msg.find("all_gather"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find("device 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0,1,3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("devices disagree"), std::string::npos) << msg;  // as docs/spmd.md shows
}

TEST(ShardMap, CollectiveFailsFastWhenADeviceFinishesWithoutIt) {
  Mesh m({2, 2}, {"data", "model"});
  // Device 3 returns without the psum: the others learn at once that it finished its
  // program, long before the 2 s timeout.
  auto f = shard_map(m,
                     [](DeviceContext& ctx, const std::vector<Tensor>&) {
                       Tensor x = Tensor::ones({2});
                       if (ctx.device() != 3) x = psum(ctx, x, {"data", "model"});
                       return std::vector<Tensor>{x};
                     },
                     {}, {P("data")}, {.timeout = std::chrono::milliseconds(2000)});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<CommError>([&] { f(std::vector<Tensor>{}); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.5) << msg;
  EXPECT_NE(msg.find("[psum over (\"data\", \"model\")] [all_reduce] cannot complete call #"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" of group (0,1,2,3): device 3 did not arrive (device 3 finished its "
                     "program)"),
            std::string::npos)
      << msg;
}

TEST(ShardMap, SkippedCollectiveTimesOutNamingTheMissingDevice) {
  Mesh m({2, 2}, {"data", "model"});
  // Device 3 neither calls the psum nor finishes until well after the 300 ms deadline,
  // so the others can only time out.
  auto f = shard_map(m,
                     [](DeviceContext& ctx, const std::vector<Tensor>&) {
                       Tensor x = Tensor::ones({2});
                       if (ctx.device() == 3) {
                         std::this_thread::sleep_for(std::chrono::milliseconds(900));
                       } else {
                         x = psum(ctx, x, {"data", "model"});
                       }
                       return std::vector<Tensor>{x};
                     },
                     {}, {P("data")}, {.timeout = std::chrono::milliseconds(300)});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of<CommError>([&] { f(std::vector<Tensor>{}); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(secs, 0.3) << msg;
  EXPECT_LT(secs, 1.8) << msg;
  EXPECT_NE(msg.find("[psum over (\"data\", \"model\")] [all_reduce] timed out after 300 ms "
                     "at call #"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" of group (0,1,2,3): device 3 did not arrive (device 3 is not in a "
                     "communicator call)"),
            std::string::npos)
      << msg;
}

TEST(DeviceContext, CoordinatesAxisIndicesAndSizes) {
  for (const Mesh& m : distjax::testing::test_meshes()) {
    std::mutex mu;
    std::set<int> seen;
    auto f =
        shard_map(m,
                  [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                    {
                      std::lock_guard<std::mutex> lock(mu);
                      seen.insert(ctx.device());
                    }
                    EXPECT_EQ(ctx.coords(), m.coords(ctx.device()));
                    for (const auto& a : m.axis_names()) {
                      EXPECT_EQ(axis_index(ctx, a), m.index_along(ctx.device(), a));
                      EXPECT_EQ(axis_size(ctx, a), m.axis_size(a));
                      EXPECT_EQ(ctx.comm(a).size(), m.axis_size(a));
                      EXPECT_EQ(ctx.comm(a).group(), m.group(ctx.device(), a));
                    }
                    const Axes all(m.axis_names());
                    EXPECT_EQ(ctx.axis_index(all), ctx.device());
                    EXPECT_EQ(ctx.axis_size(all), m.size());
                    // A set of axes out of mesh order: same members, another ranking.
                    std::vector<std::string> rev(m.axis_names().rbegin(), m.axis_names().rend());
                    EXPECT_EQ(ctx.comm(Axes(rev)).group(), m.group(ctx.device(), Axes(rev)));
                    EXPECT_EQ(ctx.comm(Axes()).size(), 1);
                    // axis_index as a value: psum of it over the group is n(n-1)/2.
                    const int n = ctx.axis_size(all);
                    Tensor s = psum(ctx, Tensor::scalar(ctx.axis_index(all)), all);
                    EXPECT_EQ(s.item<float>(), n * (n - 1) / 2.f);
                    return std::vector<Tensor>{};
                  },
                  {}, {});
    f(std::vector<Tensor>{});
    EXPECT_EQ(static_cast<int>(seen.size()), m.size()) << m.describe();
  }
}

TEST(DeviceContext, FoldRngOverAxesDiffersWhereItMustAndAgreesElsewhere) {
  Mesh m({2, 2, 2}, {"pipe", "data", "model"});
  std::mutex mu;
  std::vector<Key> by_data(8), by_data_model(8), by_none(8);
  auto f = shard_map(m,
                     [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                       const Key k = Key::from_seed(42);
                       std::lock_guard<std::mutex> lock(mu);
                       by_data[ctx.device()] = fold_rng_over_axis(ctx, k, "data");
                       by_data_model[ctx.device()] = ctx.fold_rng_over_axis(k, {"data", "model"});
                       by_none[ctx.device()] = ctx.fold_rng_over_axis(k, Axes());
                       return std::vector<Tensor>{};
                     },
                     {}, {});
  f(std::vector<Tensor>{});
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      const auto ca = m.coords(a), cb = m.coords(b);
      EXPECT_EQ(by_data[a] == by_data[b], ca[1] == cb[1]) << a << " " << b;
      EXPECT_EQ(by_data_model[a] == by_data_model[b], ca[1] == cb[1] && ca[2] == cb[2])
          << a << " " << b;
      EXPECT_EQ(by_none[a], by_none[b]);
    }
  }
  EXPECT_EQ(by_none[0], Key::from_seed(42));
}

TEST(DeviceContext, CountsCollectiveCallsAndBytes) {
  Mesh m = Mesh::line(4);
  std::mutex mu;
  std::vector<std::int64_t> gathers(4), transposes(4), bytes(4);
  ShardMapOptions opts;
  opts.on_exit = [&](DeviceContext& ctx) {
    std::lock_guard<std::mutex> lock(mu);
    gathers[ctx.device()] = ctx.counters().collective_calls["all_gather"];
    transposes[ctx.device()] = ctx.counters().collective_calls["all_gather.T"];
    bytes[ctx.device()] = ctx.comm_stats()[comm::OpKind::AllGather].bytes_sent;
  };
  auto f = shard_map(
      m,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        TensorTree p;
        p.set("x", Tensor::ones({256}));
        autodiff::grad([&](const TensorTree& t) {
          return tensor::sum(all_gather(ctx, t.at("x"), "data", 0, true));
        })(p);
        return std::vector<Tensor>{};
      },
      {}, {}, opts);
  f(std::vector<Tensor>{});
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(gathers[d], 1);
    EXPECT_EQ(transposes[d], 1);
    EXPECT_EQ(bytes[d], 3 * 256 * 4);  // (p - 1) * block bytes, the ring figure
  }
}

TEST(DeviceContext, CountsCommunicationPerMeshAxis) {
  Mesh m({2, 4}, {"data", "model"});
  constexpr std::int64_t kN = 1000, kB = 4 * kN;  // floats and bytes of one block
  std::mutex mu;
  std::vector<comm::CommStats> stats(8);
  ShardMapOptions opts;
  opts.on_exit = [&](DeviceContext& ctx) {
    std::lock_guard<std::mutex> lock(mu);
    stats[ctx.device()] = ctx.comm_stats();
  };
  auto f = shard_map(
      m,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        comm::CommStats& s = ctx.comm_stats();
        // The context's splits ran on the world, which is the group along all axes.
        EXPECT_EQ(ctx.world().label(), "data,model");
        EXPECT_EQ(s.group_labels(), std::vector<std::string>{"data,model"});
        EXPECT_EQ(s.of("data,model", comm::OpKind::Split).calls, 3);
        EXPECT_EQ(ctx.comm_label({"model", "data"}), "data,model");
        EXPECT_EQ(ctx.comm_label(Axes{}), "");
        EXPECT_EQ(ctx.comm("model").label(), "model");
        s.reset();
        Tensor x = Tensor::ones({kN});
        psum(ctx, x, "model");
        all_gather(ctx, x, "data", 0, true);
        ppermute(ctx, x, "model", ring_permutation(4));
        psum(ctx, x, {"data", "model"});
        psum(ctx, x, {"model", "data"});  // split on first use, then counted with the above
        return std::vector<Tensor>{};
      },
      {}, {}, opts);
  f(std::vector<Tensor>{});
  using comm::OpKind;
  for (int d = 0; d < 8; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    const comm::CommStats& s = stats[d];
    // psum over "model" (p = 4): 2(p-1)/p * B; nothing over "data".
    EXPECT_EQ(s.of("model", OpKind::AllReduce).calls, 1);
    EXPECT_EQ(s.of("model", OpKind::AllReduce).bytes_sent, 2 * 3 * kB / 4);
    EXPECT_EQ(s.of("model", OpKind::AllReduce).bytes_received, 2 * 3 * kB / 4);
    EXPECT_EQ(s.of("data", OpKind::AllReduce).calls, 0);
    // all_gather over "data" (p = 2): (p-1) * B.
    EXPECT_EQ(s.of("data", OpKind::AllGather).calls, 1);
    EXPECT_EQ(s.of("data", OpKind::AllGather).bytes_sent, kB);
    EXPECT_EQ(s.of("model", OpKind::AllGather).calls, 0);
    // ppermute over "model": one send and one receive of B.
    EXPECT_EQ(s.of("model", OpKind::Send).calls, 1);
    EXPECT_EQ(s.of("model", OpKind::Send).bytes_sent, kB);
    EXPECT_EQ(s.of("model", OpKind::Recv).bytes_received, kB);
    EXPECT_EQ(s.of("data", OpKind::Send).calls, 0);
    // psum over both axes (p = 8), in either order: 2 * 2(p-1)/p * B.
    EXPECT_EQ(s.of("data,model", OpKind::AllReduce).calls, 2);
    EXPECT_EQ(s.of("data,model", OpKind::AllReduce).bytes_sent, 2 * 2 * 7 * kB / 8);
    EXPECT_EQ(s.of("data,model", OpKind::Split).calls, 1);
    EXPECT_EQ(s.for_group("model,data"), nullptr);
    EXPECT_EQ(s.of("world", OpKind::AllReduce).calls, 0);
    // The totals are the sum over the groups.
    auto labels = s.group_labels();
    EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()),
              (std::set<std::string>{"data", "model", "data,model"}));
    for (int k = 0; k < comm::kNumOpKinds; ++k) {
      std::int64_t sent = 0, received = 0, calls = 0;
      for (const auto& l : labels) {
        sent += s.of(l, static_cast<OpKind>(k)).bytes_sent;
        received += s.of(l, static_cast<OpKind>(k)).bytes_received;
        calls += s.of(l, static_cast<OpKind>(k)).calls;
      }
      EXPECT_EQ(sent, s[static_cast<OpKind>(k)].bytes_sent);
      EXPECT_EQ(received, s[static_cast<OpKind>(k)].bytes_received);
      EXPECT_EQ(calls, s[static_cast<OpKind>(k)].calls);
    }
    EXPECT_EQ(s.total_bytes_sent(), 2 * 3 * kB / 4 + kB + kB + 2 * 2 * 7 * kB / 8);
  }
}

// The messages docs/spmd.md ("Errors") shows beside the mismatch's (above): a device that
// returns without a collective, a device late past the timeout.
TEST(ShardMap, CommErrorsTheDocsShow) {
  const Mesh line = Mesh::line(4);
  auto skipped = shard_map(line,
                           [](DeviceContext& ctx, const std::vector<Tensor>&) {
                             Tensor x = Tensor::ones({2});
                             if (ctx.device() != 3) x = psum(ctx, x, "data");
                             return std::vector<Tensor>{x};
                           },
                           {}, {P("data")}, {.timeout = std::chrono::milliseconds(300)});
  const std::string m2 = error_of<CommError>([&] { skipped(std::vector<Tensor>{}); });
  EXPECT_NE(m2.find("device 3 did not arrive (device 3 finished its program)"), std::string::npos)
      << m2;

  auto late = shard_map(line,
                        [](DeviceContext& ctx, const std::vector<Tensor>&) {
                          if (ctx.device() == 3)
                            std::this_thread::sleep_for(std::chrono::milliseconds(600));
                          return std::vector<Tensor>{psum(ctx, Tensor::ones({2}), "data")};
                        },
                        {}, {P()}, {.timeout = std::chrono::milliseconds(300)});
  const std::string m3 = error_of<CommError>([&] { late(std::vector<Tensor>{}); });
  EXPECT_NE(m3.find("timed out after 300 ms"), std::string::npos) << m3;
  EXPECT_NE(m3.find("device 3 did not arrive"), std::string::npos) << m3;
  std::printf("skipped: %s\nlate: %s\n", m2.c_str(), m3.c_str());
}
