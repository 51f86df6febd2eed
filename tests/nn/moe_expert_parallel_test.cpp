// nn::MoE with its experts split over an "expert" axis of 2 and 4 simulated devices, each
// device routing its own tokens, against the same layer on one device applied to each
// device's tokens: the output and every gradient (the tokens, the router, the experts)
// within 1e-6, for both dispatchers (all-to-all, in one exchange and in chunks overlapped
// with the experts, and all-gather), dropless and with a capacity by position or by
// probability, GELU and SwiGLU experts, a shared expert; and with each expert's hidden width
// (and the shared expert's) split over a "model" axis, the tokens whole or split over it.
// The two dispatchers agree with each other within 1e-6, and a run is repeatable bit for
// bit.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/nn/moe.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "spmd/spmd_test_util.hpp"

namespace distjax::nn {
namespace {

using namespace distjax::tensor;
using distjax::testing::expect_close;
using distjax::testing::random_tensor;
using Dispatcher = MoE::Dispatcher;

// f32 sums of the same terms in another order (the experts' gradients over rows that
// arrive from other devices).
constexpr double kTol = 1e-6;
constexpr std::int64_t kTokens = 16, kWidth = 8;  // tokens per device

// The layer's values and gradients, as one device holds them: every device's tokens in
// device order, the whole router and all the experts.
struct Result {
  Tensor y, dx;
  TensorTree dparams;
};

// The experts, split over the expert axis.
bool split(const std::string& path) { return path.rfind("experts/", 0) == 0; }

TensorTree params_of(const MoE& m) {
  TensorTree p;
  m(Scope::init(&p, Key::from_seed(11)), Tensor::zeros({1, kWidth}));
  // A trained-looking router: the init's logits are near zero and would all but tie.
  p.set("router/kernel", mul_scalar(p.at("router/kernel"), 4.0));
  return p;
}

// One device, device i's tokens at a time (a capacity is a device's: the same split).
Result one_device(const MoE& m, const TensorTree& params, const Tensor& x, const Tensor& cot,
                  int devices) {
  Result r;
  std::vector<Tensor> ys, dxs;
  for (int i = 0; i < devices; ++i) {
    TensorTree p = params;
    p.set("x", slice(x, 0, i * kTokens, (i + 1) * kTokens));
    Tensor out;
    auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& q) {
      out = m(Scope::apply(&q, /*train=*/true), q.at("x"));
      return sum(mul(out, slice(cot, 0, i * kTokens, (i + 1) * kTokens)));
    })(p);
    ys.push_back(out.detach());
    dxs.push_back(g.at("x"));
    for (const std::string& path : params.paths())
      r.dparams.set(path, i == 0 ? g.at(path) : add(r.dparams.at(path), g.at(path)));
  }
  r.y = concat(ys, 0);
  r.dx = concat(dxs, 0);
  return r;
}

// The dimension split over "model" when the layer splits the experts over it: the hidden
// one of a stacked expert parameter ((E, C, H), fc2's (E, H, C)) and of the shared expert's
// (fc1 by columns, fc2 by rows); -1 for what stays whole.
int model_dim(const std::string& path) {
  if (split(path)) return path == "experts/fc2" ? 1 : 2;
  if (path == "shared/fc1/kernel") return 1;
  if (path == "shared/fc1/bias" || path == "shared/fc2/kernel") return 0;
  return -1;
}

// The same on a mesh ("expert" = devices, "model" = tp): device (i, j) holds expert group
// i's tokens (with `sequence`, their j-th part, as sequence parallelism splits them), the
// router and its E / n experts, each expert's hidden slice j (and the shared expert's) when
// the layer splits them over "model". The replicated parameters' gradients are summed over
// the expert axis (each group's are its tokens'; the devices of "model" hold the same); the
// experts' come scaled by 1 / n (the mean the data-parallel average makes of the other
// parameters'), so times n they are the sums.
Result expert_parallel(const MoE& m, const TensorTree& params, const Tensor& x, const Tensor& cot,
                       int devices, int tp = 1, bool sequence = false) {
  std::vector<std::vector<Tensor>> per(static_cast<std::size_t>(devices * tp));
  const std::vector<std::string> paths = params.paths();
  std::mutex mu;
  spmd::ShardMapOptions options;
  options.intra_op_threads = 1;
  spmd::shard_map(
      mesh::Mesh({devices, tp}, {kExpertAxis, "model"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        const int me = ctx.axis_index(kExpertAxis), slice_of = ctx.axis_index("model");
        const std::int64_t el = m.num_experts / devices;
        // Leaves as shard_map hands a device its shards: varying over the expert axis (and the
        // experts' slices over "model").
        auto leaf = [&](const Tensor& t, bool sliced) {
          Tensor l = make_leaf(t.clone());
          l.set_varying_axes(ctx.axis_mask(sliced ? mesh::Axes({kExpertAxis, "model"})
                                                  : mesh::Axes(kExpertAxis)));
          return l;
        };
        TensorTree p;
        std::vector<Tensor> wrt;
        for (const std::string& path : paths) {
          Tensor w = params.at(path);
          const bool sliced = model_dim(path) >= 0 && tp > 1;
          if (split(path)) w = slice(w, 0, me * el, (me + 1) * el);
          if (sliced) {
            const int d = model_dim(path);
            const std::int64_t part = w.size(d) / tp;
            w = slice(w, d, slice_of * part, (slice_of + 1) * part);
          }
          p.set(path, leaf(w, sliced));
          wrt.push_back(p.at(path));
        }
        // This device's tokens: its group's, or their part j.
        const std::int64_t part = sequence ? kTokens / tp : kTokens;
        const std::int64_t from = me * kTokens + (sequence ? slice_of * part : 0);
        const Tensor lx = leaf(slice(x, 0, from, from + part), sequence);
        wrt.push_back(lx);
        const Tensor out = m(Scope::apply(&p, /*train=*/true).on(ctx), lx);
        const Tensor loss = sum(mul(out, slice(cot, 0, from, from + part)));
        std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, wrt);
        g.push_back(out.detach());
        std::lock_guard lock(mu);
        per[static_cast<std::size_t>(me * tp + slice_of)] = std::move(g);
        return std::vector<Tensor>{};
      },
      {}, {}, options)(std::vector<Tensor>{});
  // Without a sequence split every device of "model" must hold the same output and token
  // gradients.
  for (int i = 0; i < devices && !sequence; ++i)
    for (int j = 1; j < tp; ++j) {
      const auto& a = per[static_cast<std::size_t>(i * tp)];
      const auto& b = per[static_cast<std::size_t>(i * tp + j)];
      const std::size_t np = paths.size();
      EXPECT_EQ(a[np + 1].to_vector<float>(), b[np + 1].to_vector<float>()) << "output, group " << i;
      EXPECT_EQ(a[np].to_vector<float>(), b[np].to_vector<float>()) << "d x, group " << i;
    }
  Result r;
  const std::size_t np = paths.size();
  std::vector<Tensor> ys, dxs;
  for (int i = 0; i < devices; ++i)
    for (int j = 0; j < (sequence ? tp : 1); ++j) {
      dxs.push_back(per[static_cast<std::size_t>(i * tp + j)][np]);
      ys.push_back(per[static_cast<std::size_t>(i * tp + j)][np + 1]);
    }
  r.y = concat(ys, 0);
  r.dx = concat(dxs, 0);
  for (std::size_t k = 0; k < np; ++k) {
    // Group i's gradient: its slices over "model" side by side, or device (i, 0)'s.
    std::vector<Tensor> groups;
    for (int i = 0; i < devices; ++i) {
      std::vector<Tensor> slices;
      for (int j = 0; j < tp; ++j)
        slices.push_back(per[static_cast<std::size_t>(i * tp + j)][k]);
      groups.push_back(tp > 1 && model_dim(paths[k]) >= 0 ? concat(slices, model_dim(paths[k]))
                                                          : slices[0]);
    }
    Tensor whole;
    if (split(paths[k])) {
      whole = mul_scalar(concat(groups, 0), double(devices));
    } else {
      for (int i = 0; i < devices; ++i)
        whole = i == 0 ? groups[0] : add(whole, groups[i]);
    }
    r.dparams.set(paths[k], whole);
  }
  return r;
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  expect_close(got.y, want.y, kTol, what + ": output");
  expect_close(got.dx, want.dx, kTol, what + ": d x");
  for (const std::string& path : want.dparams.paths())
    expect_close(got.dparams.at(path), want.dparams.at(path), kTol, what + ": d " + path);
}

struct Case {
  std::string name;
  MoE layer;
};

std::vector<Case> cases() {
  const MoE base{.num_experts = 8, .top_k = 2, .hidden = 6};
  std::vector<Case> out;
  auto add_case = [&](std::string name, MoE m) { out.push_back({std::move(name), m}); };
  add_case("dropless", base);
  MoE c = base;
  c.capacity_factor = 0.5;
  add_case("capacity by position", c);
  c.capacity_factor = 0.75;
  c.drop_by_probability = true;
  c.swiglu = true;
  c.renormalize = true;
  add_case("capacity by probability, swiglu", c);
  MoE s = base;
  s.shared_experts = 1;
  s.top_k = 3;
  add_case("shared expert, top-3", s);
  MoE l = base;
  l.aux_loss_coef = 0.1;
  l.z_loss_coef = 0.01;
  add_case("balancing and z losses", l);
  return out;
}

TEST(MoEExpertParallel, EveryDispatcherMatchesOneDeviceWithItsGradients) {
  for (int devices : {2, 4}) {
    const Tensor x = random_tensor(Key::from_seed(3), {devices * kTokens, kWidth});
    const Tensor cot = random_tensor(Key::from_seed(4), {devices * kTokens, kWidth});
    for (const Case& c : cases()) {
      const TensorTree params = params_of(c.layer);
      const Result want = one_device(c.layer, params, x, cot, devices);
      std::vector<std::pair<std::string, MoE>> ways;
      for (std::int64_t chunks : {1, 3}) {
        MoE m = c.layer;
        m.exchange_chunks = chunks;
        ways.emplace_back("all_to_all in " + std::to_string(chunks) + " chunks", m);
      }
      MoE g = c.layer;
      g.dispatcher = Dispatcher::AllGather;
      ways.emplace_back("all_gather", g);
      std::vector<Result> got;
      for (const auto& [how, m] : ways) {
        const std::string what = c.name + ", " + how + ", " + std::to_string(devices) + " devices";
        SCOPED_TRACE(what);
        got.push_back(expert_parallel(m, params, x, cot, devices));
        expect_same(got.back(), want, what);
      }
      // The dispatchers against each other.
      expect_same(got.back(), got.front(), c.name + ": all_gather against all_to_all");
    }
  }
}

// Expert tensor parallelism: each expert's hidden width (and the shared expert's) over
// "model" (2 devices), alone and beside an expert axis of 2, both dispatchers; with the
// tokens split over "model" too (sequence parallelism: the layer gathers them, routes them
// all and scatters the summed outputs back).
TEST(MoEExpertParallel, ExpertsSplitOverTheTensorAxisMatchOneDevice) {
  for (const auto& [devices, tp] : {std::pair{1, 2}, std::pair{2, 2}}) {
    const Tensor x = random_tensor(Key::from_seed(3), {devices * kTokens, kWidth});
    const Tensor cot = random_tensor(Key::from_seed(4), {devices * kTokens, kWidth});
    for (const Case& c : cases()) {
      const TensorTree params = params_of(c.layer);
      const Result want = one_device(c.layer, params, x, cot, devices);
      for (const bool sequence : {false, true}) {
        MoE m = c.layer;
        m.tensor_axis = "model";
        if (sequence) m.sequence_axis = "model";
        for (const Dispatcher d : {Dispatcher::AllToAll, Dispatcher::AllGather}) {
          m.dispatcher = d;
          const std::string what = c.name + (d == Dispatcher::AllGather ? ", all_gather" : "") +
                                   ", expert=" + std::to_string(devices) +
                                   " x model=" + std::to_string(tp) +
                                   (sequence ? ", tokens split over model" : "");
          SCOPED_TRACE(what);
          expect_same(expert_parallel(m, params, x, cot, devices, tp, sequence), want, what);
        }
      }
    }
  }
}

TEST(MoEExpertParallel, RunsAreRepeatableBitForBit) {
  const int devices = 4;
  const MoE m{.num_experts = 8, .top_k = 2, .hidden = 6, .exchange_chunks = 2};
  const TensorTree params = params_of(m);
  const Tensor x = random_tensor(Key::from_seed(3), {devices * kTokens, kWidth});
  const Tensor cot = random_tensor(Key::from_seed(4), {devices * kTokens, kWidth});
  const Result a = expert_parallel(m, params, x, cot, devices);
  const Result b = expert_parallel(m, params, x, cot, devices);
  EXPECT_EQ(a.y.to_vector<float>(), b.y.to_vector<float>());
  EXPECT_EQ(a.dx.to_vector<float>(), b.dx.to_vector<float>());
  for (const std::string& path : a.dparams.paths())
    EXPECT_EQ(a.dparams.at(path).to_vector<float>(), b.dparams.at(path).to_vector<float>()) << path;
}

TEST(MoEExpertParallel, ExchangeChunksBelowOneAreRefused) {
  const MoE m{.num_experts = 4, .top_k = 2, .exchange_chunks = 0};
  EXPECT_THROW(m.check(kWidth), InvalidArgument);
}

}  // namespace
}  // namespace distjax::nn
