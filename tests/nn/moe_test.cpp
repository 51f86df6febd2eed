// nn::MoE against the same layer written densely with plain ops (every expert applied to
// every token, each token's chosen outputs summed with its gates: MaxText's dense mode for
// checking numerics), values and every gradient, in its variants (GELU and SwiGLU experts,
// renormalised gates, a shared MLP, a capacity that drops); its balancing statistics on a
// router known to be uniform; bad settings refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/nn/moe.hpp"
#include "distjax/nn/remat.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/moe.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {
namespace {

using namespace distjax::tensor;

constexpr std::int64_t kTokens = 24, kWidth = 8;

Tensor tokens_input() {
  std::vector<float> v(kTokens * kWidth);
  random_uniform(Key::from_seed(3), v.data(), std::int64_t(v.size()), -1.f, 1.f);
  return Tensor::from_vector(v, {2, kTokens / 2, kWidth});
}

// The layer written densely: expert g on every token, token t's output the gated sum of
// its chosen experts' outputs (a pair the plan dropped counts nothing).
Tensor dense_reference(const MoE& m, const TensorTree& p, const Tensor& x_in) {
  const std::int64_t c = kWidth, e = m.num_experts;
  const Tensor x = reshape(x_in, {-1, c});
  const Tensor probs = softmax(matmul(x, p.at("router/kernel")));
  Tensor chosen;
  {
    NoGradGuard off;
    // The balancing bias moves the selection only.
    chosen = top_k_indices(p.contains("router/bias") ? add(probs.detach(), p.at("router/bias"))
                                                      : probs.detach(),
                           m.top_k);
  }
  Tensor gates = take_along_last(probs, chosen);
  if (m.renormalize) gates = div(gates, sum(gates, {1}, true));
  const DispatchPlan plan = dispatch_plan(chosen, e, m.capacity(x.size(0)),
                                          m.drop_by_probability ? gates.detach() : Tensor());
  const std::vector<std::int32_t> ch = chosen.to_vector<std::int32_t>();
  const std::vector<std::int32_t> pos = plan.position.to_vector<std::int32_t>();
  // weight[t, g] = the gate of expert g for token t where it was chosen and kept.
  std::vector<float> pick(static_cast<std::size_t>(x.size(0) * m.top_k * e), 0.f);
  for (std::size_t i = 0; i < ch.size(); ++i)
    if (pos[i] >= 0) pick[i * e + ch[i]] = 1.f;
  const Tensor sel = Tensor::from_vector(pick, {x.size(0), m.top_k, e});
  const Tensor weight = sum(mul(reshape(gates, {x.size(0), m.top_k, 1}), sel), {1});  // (N, E)
  Tensor y = Tensor::zeros({x.size(0), c});
  for (std::int64_t g = 0; g < e; ++g) {
    auto expert = [&](const std::string& name) {
      const Tensor w = p.at("experts/" + name);
      return reshape(slice(w, 0, g, g + 1), {w.size(1), w.size(2)});
    };
    Tensor a = matmul(x, expert("fc1"));
    a = m.swiglu ? mul(silu(matmul(x, expert("gate"))), a) : gelu(a, true);
    const Tensor out = matmul(a, expert("fc2"));
    y = add(y, mul(out, slice(weight, 1, g, g + 1)));
  }
  if (m.shared_experts > 0) {
    const Tensor s = matmul(gelu(add(matmul(x, p.at("shared/fc1/kernel")), p.at("shared/fc1/bias")),
                                 true),
                            p.at("shared/fc2/kernel"));
    y = add(y, add(s, p.at("shared/fc2/bias")));
  }
  return reshape(y, x_in.shape());
}

// The weighted balancing losses, written out: aux = E sum_e f_e P_e (f_e the fraction of
// the N k chosen pairs that chose e, P_e the mean probability of e), z = the mean over
// tokens of log(sum_e exp(logit))^2. Zero (undefined) when both weights are.
Tensor dense_balancing_losses(const MoE& m, const TensorTree& p, const Tensor& x_in) {
  if (m.aux_loss_coef == 0 && m.z_loss_coef == 0) return Tensor();
  const std::int64_t e = m.num_experts;
  const Tensor x = reshape(x_in, {-1, kWidth});
  const std::int64_t n = x.size(0);
  const Tensor logits = matmul(x, p.at("router/kernel"));
  const Tensor probs = softmax(logits);
  std::vector<std::int32_t> chosen;
  {
    NoGradGuard off;
    chosen = top_k_indices(p.contains("router/bias") ? add(probs.detach(), p.at("router/bias"))
                                                      : probs.detach(),
                           m.top_k)
                 .to_vector<std::int32_t>();
  }
  std::vector<float> f(static_cast<std::size_t>(e), 0.f);
  for (std::int32_t g : chosen) f[static_cast<std::size_t>(g)] += 1.f / float(n * m.top_k);
  const Tensor aux = mul_scalar(sum(mul(mean(probs, {0}), Tensor::from_vector(f, {e}))), double(e));
  const Tensor lse = log(sum(exp(logits), {1}));
  const Tensor z = mean(square(lse));
  return add(mul_scalar(aux, m.aux_loss_coef), mul_scalar(z, m.z_loss_coef));
}

// Values and gradients (x and every parameter) of sum(layer(x) * cot) both ways; the
// layer's balancing losses reach the gradients through the backward pass
// (autodiff::add_loss), the dense side's are added to its objective.
void expect_layer_matches_dense(const MoE& m, const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor x0 = tokens_input();
  TensorTree params;
  m(Scope::init(&params, Key::from_seed(11)), x0);
  // A trained-looking router: the init's logits are near zero and would all but tie.
  params.set("router/kernel", mul_scalar(params.at("router/kernel"), 4.0));
  // A bias that changes the selection (zeros at init).
  if (params.contains("router/bias")) {
    std::vector<float> b(static_cast<std::size_t>(m.num_experts));
    random_uniform(Key::from_seed(13), b.data(), m.num_experts, -0.3f, 0.3f);
    params.set("router/bias", Tensor::from_vector(b, {m.num_experts}));
  }
  params.set("x", x0);
  std::vector<float> cv(static_cast<std::size_t>(x0.numel()));
  random_normal(Key::from_seed(12), cv.data(), x0.numel());
  const Tensor cot = Tensor::from_vector(cv, x0.shape());
  auto run = [&](bool dense) {
    Tensor out;
    auto [loss, grads] = autodiff::value_and_grad([&](const TensorTree& p) {
      out = dense ? dense_reference(m, p, p.at("x"))
                  : m(Scope::apply(&p, /*train=*/true), p.at("x"));
      Tensor objective = sum(mul(out, cot));
      if (const Tensor aux = dense_balancing_losses(m, p, p.at("x")); dense && aux.defined())
        objective = add(objective, aux);
      return objective;
    })(params);
    return std::pair{out, grads};
  };
  const auto [got, got_grads] = run(false);
  const auto [want, want_grads] = run(true);
  auto close = [](const Tensor& a, const Tensor& b, const std::string& name) {
    ASSERT_EQ(a.shape(), b.shape()) << name;
    const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < av.size(); ++i) {
      diff += (double(av[i]) - bv[i]) * (double(av[i]) - bv[i]);
      norm += double(bv[i]) * bv[i];
    }
    EXPECT_LE(std::sqrt(diff), 1e-6 * std::sqrt(norm) + 1e-7) << name;
  };
  close(got, want, "output");
  for (const auto& [name, g] : want_grads) close(got_grads.at(name), g, "d " + name);
}

TEST(MoE, EqualsTheDenseLayerWithItsGradients) {
  expect_layer_matches_dense({.num_experts = 4, .top_k = 2, .hidden = 12}, "gelu top-2");
  expect_layer_matches_dense({.num_experts = 5, .top_k = 1, .hidden = 6}, "gelu top-1");
  expect_layer_matches_dense(
      {.num_experts = 4, .top_k = 3, .hidden = 6, .swiglu = true, .renormalize = true},
      "swiglu top-3 renormalised");
  expect_layer_matches_dense({.num_experts = 4, .top_k = 2, .hidden = 6, .shared_experts = 1},
                             "with a shared expert");
  expect_layer_matches_dense({.num_experts = 4, .top_k = 2, .hidden = 6, .capacity_factor = 0.5},
                             "capacity 0.5 by position");
  expect_layer_matches_dense(
      {.num_experts = 4, .top_k = 2, .hidden = 6, .capacity_factor = 0.5,
       .drop_by_probability = true},
      "capacity 0.5 by probability");
  expect_layer_matches_dense(
      {.num_experts = 4, .top_k = 2, .hidden = 6, .aux_loss_coef = 0.3, .z_loss_coef = 0.2},
      "with the balancing losses");
  expect_layer_matches_dense({.num_experts = 4, .top_k = 2, .hidden = 6, .swiglu = true,
                              .capacity_factor = 0.5, .aux_loss_coef = 0.5},
                             "with the balancing loss, swiglu and a capacity");
  expect_layer_matches_dense({.num_experts = 6, .top_k = 2, .hidden = 6, .balance_bias_rate = 0.1},
                             "a balancing bias in the selection");
}

// The bias moves by the rate towards balance: up for an expert below the mean load, down
// above it, not at all on it; and the layer sows its loads under the bias's path.
TEST(MoE, BalancingBiasMovesBySignOfTheLoadError) {
  TensorTree params;
  params.set("blocks/0/moe/router/bias", Tensor::from_vector(std::vector<float>{0, 0.5f, 0, 0}, {4}));
  balance_bias_update(params, {{"blocks/0/moe/router/bias", {10, 30, 20, 20}}}, 0.25);
  EXPECT_EQ(params.at("blocks/0/moe/router/bias").to_vector<float>(),
            (std::vector<float>{0.25f, 0.25f, 0, 0}));
  const MoE m{.num_experts = 4, .top_k = 2, .hidden = 6, .balance_bias_rate = 0.1};
  TensorTree p;
  m(Scope::init(&p, Key::from_seed(1)), tokens_input());
  Sown at_root;
  m(Scope::apply(&p, true).sowing(&at_root), tokens_input());
  ASSERT_EQ(at_root.loads.count("router/bias"), 1u);
  double pairs = 0;
  for (double l : at_root.loads.at("router/bias")) pairs += l;
  EXPECT_EQ(pairs, double(kTokens * 2));
}

TEST(MoE, SowsItsStatistics) {
  const MoE m{.num_experts = 4, .top_k = 2, .hidden = 6, .capacity_factor = 0.5,
              .aux_loss_coef = 0.01, .z_loss_coef = 0.001};
  const Tensor x = tokens_input();
  TensorTree params;
  m(Scope::init(&params, Key::from_seed(1)), x);
  // A zero router: every probability 1/E, so the balancing loss is E sum_e f_e / E = 1 and
  // the z-loss log(E)^2 whatever the routing; the top-2 of equal scores is experts 0 and 1
  // for every token: the busiest expert takes N of the N k / E mean (load 2), and a
  // capacity of 0.5 N k / E = N/4 keeps a quarter of each of their N pairs.
  params.set("router/kernel", Tensor::zeros({kWidth, 4}));
  Sown sown;
  m(Scope::apply(&params, true).sowing(&sown), x);
  auto metric = [&](const char* name) {
    EXPECT_EQ(sown.metrics[name].size(), 1u) << name;
    return sown.metrics[name].at(0).item<double>();
  };
  EXPECT_NEAR(metric("aux_loss"), 1.0, 1e-6);
  EXPECT_NEAR(metric("z_loss"), std::log(4.0) * std::log(4.0), 1e-5);
  EXPECT_DOUBLE_EQ(metric("expert_load_max_over_mean"), 2.0);
  EXPECT_DOUBLE_EQ(metric("dropped_fraction"), 0.75);
  // Without a Sown it sows nothing and runs alike.
  EXPECT_EQ(m(Scope::apply(&params, true), x).shape(), x.shape());
}

// Under rematerialisation (nn::remat_call: the layer run again in the backward pass) the
// balancing losses still reach the gradients (the recomputation attaches them), and the
// statistics are sown once.
TEST(MoE, RematerialisedItHasTheSameGradientsAndSowsOnce) {
  const MoE m{.num_experts = 4, .top_k = 2, .hidden = 6, .aux_loss_coef = 0.3, .z_loss_coef = 0.2};
  const Tensor x0 = tokens_input();
  TensorTree params;
  m(Scope::init(&params, Key::from_seed(11)).child("moe"), x0);
  params.set("moe/router/kernel", mul_scalar(params.at("moe/router/kernel"), 4.0));
  params.set("x", x0);
  std::vector<float> cv(static_cast<std::size_t>(x0.numel()));
  random_normal(Key::from_seed(12), cv.data(), x0.numel());
  const Tensor cot = Tensor::from_vector(cv, x0.shape());
  auto run = [&](bool remat, Sown* sown) {
    return autodiff::value_and_grad([&](const TensorTree& p) {
      Scope scope = Scope::apply(&p, /*train=*/true).sowing(sown);
      const Tensor out = remat_call(remat, scope, p.at("x"), [m](const Scope& s, const Tensor& in) {
        return m(s.child("moe"), in);
      });
      return sum(mul(out, cot));
    })(params).second;
  };
  Sown once;
  const TensorTree want = run(false, nullptr), got = run(true, &once);
  for (const auto& [name, g] : want) {
    const std::vector<float> a = got.at(name).to_vector<float>(), b = g.to_vector<float>();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << name << " " << i;
  }
  EXPECT_EQ(once.metrics["aux_loss"].size(), 1u);
  EXPECT_EQ(once.metrics["z_loss"].size(), 1u);
}

TEST(MoE, CountsItsParameters) {
  for (const MoE& m : {MoE{.num_experts = 4, .top_k = 2, .hidden = 12},
                       MoE{.num_experts = 3, .top_k = 1, .hidden = 5, .swiglu = true,
                           .shared_experts = 2}}) {
    TensorTree params;
    m(Scope::init(&params, Key::from_seed(1)), tokens_input());
    EXPECT_EQ(params.num_elements(), m.num_params(kWidth));
    EXPECT_LT(m.active_params(kWidth), m.num_params(kWidth));
  }
}

TEST(MoE, BadSettingsAreRefusedNamingThem) {
  TensorTree params;
  const Scope s = Scope::init(&params, Key::from_seed(1));
  auto refused = [&](const MoE& m, const char* words) {
    try {
      m(s, tokens_input());
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({.num_experts = 4, .top_k = 5}, "top_k = 5");
  refused({.num_experts = 16, .top_k = 9}, "top_k = 9");
  refused({.num_experts = 4, .capacity_factor = 0}, "capacity_factor = 0");
  refused({.num_experts = 0}, "num_experts = 0");
}

}  // namespace
}  // namespace distjax::nn
