// Context parallelism: ring attention (balanced and plain layouts) and Ulysses on context
// axes of 1, 2, 4 and 8 devices, alone and beside a data axis, against attention over the
// whole sequence on one device (output and the gradients of q, k, v within 1e-6); the
// balanced layout's even work (attention pairs counted by the kernels); the layout's
// arithmetic; bad input.
#include "distjax/parallel/context_parallel.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using distjax::testing::expect_close;
using distjax::testing::random_tensor;
using parallel::ContextLayout;

namespace {

// f32 sums of the same terms in another order (blockwise with the online rescale, ring
// order for the key and value gradients).
constexpr double kTol = 1e-6;

// One OpenMP thread per device: make test-tsan runs these, and TSan does not see libgomp's
// barriers between a device thread and its workers.
void on_devices(const Mesh& m, const std::function<void(DeviceContext&)>& fn) {
  ShardMapOptions options;
  options.intra_op_threads = 1;
  auto f = shard_map(
      m,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        fn(ctx);
        return std::vector<Tensor>{};
      },
      {}, {}, options);
  f(std::vector<Tensor>{});
}

enum class Method { Ring, Ulysses };

struct Case {
  Mesh mesh;
  Method method;
  bool balanced;
  bool causal = true;
  bool overlap = true;  // the ring's transfers overlapped with the attention
};

std::string name_of(const Case& c) {
  return std::string(c.method == Method::Ring ? "ring" : "ulysses") +
         (c.balanced ? " balanced" : " plain") + (c.causal ? " causal" : " full") + " on " +
         std::to_string(c.mesh.size()) + " devices";
}

class ContextParallel : public ::testing::TestWithParam<Case> {};

// q, k, v and the output's cotangent of the whole sequence: (B, H, T, D), the same on every
// device (one key). Each data replica uses its own batch row.
constexpr std::int64_t kB = 2, kH = 4, kT = 64, kD = 8;

Tensor input(int which) {
  return random_tensor(Key::from_seed(7).fold_in(static_cast<std::uint64_t>(which)),
                       {kB, kH, kT, kD});
}

TEST_P(ContextParallel, MatchesAttentionOverTheWholeSequence) {
  const Case c = GetParam();
  SCOPED_TRACE(name_of(c));
  // The reference: one device, the whole sequence, its gradients from the tape.
  const Tensor q = input(0), k = input(1), v = input(2), ct = input(3);
  Tensor lq = tensor::make_leaf(q), lk = tensor::make_leaf(k), lv = tensor::make_leaf(v);
  const Tensor want = tensor::attention(lq, lk, lv, c.causal);
  const std::vector<Tensor> dwant =
      autodiff::grad({tensor::sum(tensor::mul(want, ct))}, {Tensor()}, {lq, lk, lv});

  const int n = c.mesh.axis_size("context");
  const ContextLayout layout{n, c.balanced};
  const bool data = c.mesh.has_axis("data");
  std::mutex mu;
  // By [data index][context index]: this device's output and its q, k, v gradients.
  const int replicas = data ? c.mesh.axis_size("data") : 1;
  std::vector<std::vector<std::vector<Tensor>>> got(
      static_cast<std::size_t>(replicas), std::vector<std::vector<Tensor>>(static_cast<std::size_t>(n)));
  on_devices(c.mesh, [&](DeviceContext& ctx) {
    const int me = ctx.axis_index("context");
    // Data replica r takes batch row r (of kB = 2) of every input.
    const int row = data ? ctx.axis_index("data") : 0;
    const auto mine = [&](const Tensor& x) {
      return layout.shard(data ? tensor::slice(x, 0, row, row + 1) : x, 2, me);
    };
    // This device's tokens, as shard_map hands them in: leaves that vary over the mesh.
    const auto leaf = [&](int i) {
      Tensor x = tensor::make_leaf(mine(input(i)));
      x.set_varying_axes(ctx.axis_mask(Axes(ctx.mesh().axis_names())));
      return x;
    };
    const Tensor lq = leaf(0), lk = leaf(1), lv = leaf(2);
    const Tensor o =
        c.method == Method::Ring
            ? parallel::ring_attention(ctx, lq, lk, lv, "context", layout, c.causal, 0.f,
                                       c.overlap)
            : parallel::ulysses_attention(ctx, lq, lk, lv, "context", layout, c.causal);
    const Tensor loss = tensor::sum(tensor::mul(o, mine(input(3))));
    std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {lq, lk, lv});
    g.insert(g.begin(), o.detach());
    std::lock_guard lk_(mu);
    got[static_cast<std::size_t>(row)][static_cast<std::size_t>(me)] = g;
  });
  // Each replica's shares, put back in sequence order and the replicas' rows side by side.
  const char* const what[] = {"output", "dq", "dk", "dv"};
  const std::vector<Tensor> want_all{want.detach(), dwant[0], dwant[1], dwant[2]};
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<Tensor> rows;
    for (const auto& replica : got) {
      std::vector<Tensor> shares;
      for (const auto& dev : replica)
        shares.push_back(dev[i]);
      rows.push_back(layout.unshard(shares, 2));
    }
    const Tensor whole = rows.size() == 1 ? rows[0] : tensor::concat(rows, 0);
    expect_close(whole, want_all[i], kTol, what[i]);
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int n : {1, 2, 4, 8}) {
    const Mesh m({n}, {"context"});
    out.push_back({m, Method::Ring, true});
    out.push_back({m, Method::Ring, false});
    if (kH % n == 0) out.push_back({m, Method::Ulysses, true});
  }
  out.push_back({Mesh({4}, {"context"}), Method::Ring, true, false});
  out.push_back({Mesh({4}, {"context"}), Method::Ring, true, true, /*overlap=*/false});
  out.push_back({Mesh({2}, {"context"}), Method::Ulysses, false, false});
  // Beside a data axis: the data axis first and last.
  out.push_back({Mesh({2, 2}, {"data", "context"}), Method::Ring, true});
  out.push_back({Mesh({4, 2}, {"context", "data"}), Method::Ring, true});
  out.push_back({Mesh({2, 2}, {"data", "context"}), Method::Ulysses, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Meshes, ContextParallel, ::testing::ValuesIn(cases()));

// The attention pairs each device's kernels computed, from DeviceCounters, at cp = n.
std::vector<std::int64_t> pairs_per_device(int n, bool balanced) {
  const ContextLayout layout{n, balanced};
  std::vector<std::int64_t> pairs(static_cast<std::size_t>(n));
  std::mutex mu;
  on_devices(Mesh({n}, {"context"}), [&](DeviceContext& ctx) {
    const int me = ctx.axis_index("context");
    const auto mine = [&](int i) { return layout.shard(input(i), 2, me); };
    parallel::ring_attention(ctx, mine(0), mine(1), mine(2), "context", layout);
    std::lock_guard lk(mu);
    pairs[static_cast<std::size_t>(me)] = ctx.counters().attention_pairs;
  });
  return pairs;
}

double max_over_mean(const std::vector<std::int64_t>& v) {
  const double mean =
      static_cast<double>(std::accumulate(v.begin(), v.end(), std::int64_t{0})) /
      static_cast<double>(v.size());
  return static_cast<double>(*std::max_element(v.begin(), v.end())) / mean;
}

TEST(ContextParallelBalance, BalancedLayoutEvensTheCausalWork) {
  for (int n : {4, 8}) {
    const std::vector<std::int64_t> balanced = pairs_per_device(n, true),
                                    plain = pairs_per_device(n, false);
    // The kernels' own counts agree with the layout's arithmetic, and cover the triangle.
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(balanced[static_cast<std::size_t>(r)],
                parallel::context_attention_pairs({n, true}, r, kT) * kB * kH);
      total += balanced[static_cast<std::size_t>(r)];
    }
    EXPECT_EQ(total, kB * kH * kT * (kT + 1) / 2);
    EXPECT_LE(max_over_mean(balanced), 1.05) << n << " devices";
    // Plain: the last device's work over the mean, about (2n - 1) / n.
    EXPECT_GE(max_over_mean(plain), 1.7) << n << " devices";
  }
}

TEST(ContextLayout, PositionsShardAndUnshard) {
  const ContextLayout balanced{4, true}, plain{4, false};
  EXPECT_EQ(balanced.positions(1, 16), (std::vector<std::int32_t>{2, 3, 12, 13}));
  EXPECT_EQ(plain.positions(1, 16), (std::vector<std::int32_t>{4, 5, 6, 7}));
  const Tensor x = input(0);
  std::vector<Tensor> shares;
  for (int r = 0; r < 4; ++r)
    shares.push_back(balanced.shard(x, 2, r));
  expect_close(balanced.unshard(shares, 2), x, 0, "unshard of shard");
  EXPECT_THROW(balanced.positions(0, 12), InvalidArgument);  // 12 over 8 chunks
  EXPECT_NO_THROW(plain.positions(0, 12));
}

TEST(ContextParallelErrors, UlyssesNeedsHeadsThatSplit) {
  EXPECT_THROW(on_devices(Mesh({8}, {"context"}),
                          [&](DeviceContext& ctx) {
                            const ContextLayout layout{8, true};
                            const Tensor x = layout.shard(input(0), 2, ctx.axis_index("context"));
                            parallel::ulysses_attention(ctx, x, x, x, "context", layout);
                          }),
               Error);
}

}  // namespace
