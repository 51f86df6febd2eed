// Optimizer updates against PyTorch 1.13 (torch.optim.SGD / Adam / AdamW) on the same
// parameters and gradient sequence: values printed by torch and stored here. And, over a
// tree of many leaves, the optimizers' multi-leaf updates against the per-leaf update ops.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/update_ops.hpp"

namespace distjax::optim {
namespace {

const std::vector<float> kP0 = {0.5f, -1.0f, 2.0f, 0.25f};
const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f, 0.0f}, {-0.5f, 0.4f, 0.1f, 1.0f}, {0.2f, 0.2f, -0.7f, -0.3f}};

// Runs the three steps on a one-leaf tree "layer/kernel" and returns the parameters.
std::vector<float> run(const Optimizer& opt, const std::string& path = "layer/kernel") {
  TensorTree params;
  params.set(path, Tensor::from_vector(kP0, {2, 2}));
  TensorTree state = opt.init(params);
  for (std::size_t s = 0; s < kGrads.size(); ++s) {
    TensorTree grads;
    grads.set(path, Tensor::from_vector(kGrads[s], {2, 2}));
    opt.update(params, grads, state, static_cast<std::int64_t>(s));
  }
  return params.at(path).to_vector<float>();
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol = 2e-7f) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(SGD, MatchesTorchPlain) {
  SGD opt({.learning_rate = constant_schedule(0.1)});
  EXPECT_TRUE(opt.init(TensorTree()).empty());
  expect_near(run(opt), {0.520000041f, -1.03999996f, 2.02999997f, 0.180000007f});
}

TEST(SGD, MatchesTorchMomentumAndWeightDecay) {
  SGD opt({.learning_rate = constant_schedule(0.1), .momentum = 0.9, .weight_decay = 0.01});
  expect_near(run(opt), {0.545085371f, -1.03623068f, 1.95861363f, 0.0886986926f});
}

TEST(SGD, MatchesTorchNesterov) {
  SGD opt({.learning_rate = constant_schedule(0.1), .momentum = 0.9, .nesterov = true});
  expect_near(run(opt), {0.563109994f, -1.07762003f, 2.00272989f, 0.0360000059f});
}

TEST(SGD, MomentumStateIsShapedLikeParams) {
  SGD opt({.learning_rate = constant_schedule(0.1), .momentum = 0.9});
  TensorTree params;
  params.set("a/kernel", Tensor::ones({3, 2}));
  params.set("a/bias", Tensor::ones({2}));
  params.set("step_ids", Tensor::zeros({4}, DType::I32));  // not trained
  TensorTree state = opt.init(params);
  EXPECT_EQ(state.paths(), (std::vector<std::string>{"momentum/a/bias", "momentum/a/kernel"}));
  EXPECT_EQ(state.at("momentum/a/kernel").shape(), (Shape{3, 2}));
  EXPECT_THROW(SGD({.learning_rate = constant_schedule(0.1), .nesterov = true}), InvalidArgument);
}

TEST(Adam, MatchesTorch) {
  Adam opt({.learning_rate = constant_schedule(0.01)});
  expect_near(run(opt), {0.497955501f, -0.998853445f, 1.9843421f, 0.238885716f});
}

TEST(Adam, MatchesTorchCoupledWeightDecay) {
  Adam opt({.learning_rate = constant_schedule(0.01), .weight_decay = 0.1});
  expect_near(run(opt), {0.495363265f, -0.99242866f, 1.97899866f, 0.228391245f});
}

TEST(Adam, FirstStepMovesEachCoordinateByLr) {
  // With bias correction the first update is lr * g / (|g| + eps): a sign step.
  Adam opt({.learning_rate = constant_schedule(0.5)});
  TensorTree params, grads;
  params.set("w", Tensor::from_vector<float>({1.f, 1.f, 1.f}, {3}));
  grads.set("w", Tensor::from_vector<float>({3.f, -0.01f, 0.f}, {3}));
  TensorTree state = opt.init(params);
  opt.update(params, grads, state, 0);
  expect_near(params.at("w").to_vector<float>(), {0.5f, 1.5f, 1.f}, 1e-5f);
  // mu = 0.1 g, nu = 0.001 g^2.
  expect_near(state.at("mu/w").to_vector<float>(), {0.3f, -0.001f, 0.f}, 1e-7f);
  expect_near(state.at("nu/w").to_vector<float>(), {0.009f, 1e-7f, 0.f}, 1e-9f);
}

TEST(AdamW, MatchesTorchDecoupledWeightDecay) {
  AdamW opt({.learning_rate = constant_schedule(0.01), .weight_decay = 0.1});
  expect_near(run(opt), {0.496471018f, -0.995872855f, 1.97837687f, 0.238143921f});
}

TEST(AdamW, MaskedLeafIsNotDecayed) {
  AdamW opt({.learning_rate = constant_schedule(0.01),
             .weight_decay = 0.1,
             .decay_mask = default_decay_mask()});
  EXPECT_TRUE(opt.decays("blocks/0/mlp/fc1/kernel"));
  EXPECT_FALSE(opt.decays("blocks/0/mlp/fc1/bias"));
  EXPECT_FALSE(opt.decays("blocks/0/ln_1/scale"));
  EXPECT_FALSE(opt.decays("final_norm/weight"));
  // A bias follows plain Adam (torch AdamW with weight_decay=0), a kernel decays.
  expect_near(run(opt, "layer/bias"), {0.497955501f, -0.998853445f, 1.9843421f, 0.238885716f});
  expect_near(run(opt, "layer/kernel"), {0.496471018f, -0.995872855f, 1.97837687f, 0.238143921f});

  DecayMask custom = decay_mask_excluding({"bias"}, {"embed"});
  EXPECT_TRUE(custom("fc/kernel"));
  EXPECT_FALSE(custom("fc/bias"));
  EXPECT_FALSE(custom("tok_embed/table"));
}

TEST(AdamW, UsesTheScheduleOfEachStep) {
  // lr 0 at step 0 (warmup start) must leave the parameters unchanged but move the moments.
  AdamW opt({.learning_rate = linear_schedule(0.0, 0.01, 10), .weight_decay = 0.1});
  TensorTree params, grads;
  params.set("w", Tensor::from_vector(kP0, {4}));
  grads.set("w", Tensor::from_vector(kGrads[0], {4}));
  TensorTree state = opt.init(params);
  opt.update(params, grads, state, 0);
  EXPECT_EQ(params.at("w").to_vector<float>(), kP0);
  EXPECT_NEAR(state.at("mu/w").to_vector<float>()[0], 0.01f, 1e-8f);
  EXPECT_DOUBLE_EQ(opt.learning_rate(5), 0.005);
}

TEST(Optimizer, RejectsMismatchedGradientsAndState) {
  AdamW opt({});
  TensorTree params;
  params.set("w", Tensor::ones({2, 2}));
  TensorTree state = opt.init(params);
  TensorTree missing;
  EXPECT_THROW(opt.update(params, missing, state, 0), InvalidArgument);
  TensorTree wrong_shape;
  wrong_shape.set("w", Tensor::ones({4}));
  EXPECT_THROW(opt.update(params, wrong_shape, state, 0), InvalidArgument);
  TensorTree grads;
  grads.set("w", Tensor::ones({2, 2}));
  TensorTree empty_state;
  EXPECT_THROW(opt.update(params, grads, empty_state, 0), InvalidArgument);
  // The parameters were not touched by the failed calls.
  EXPECT_EQ(params.at("w").to_vector<float>(), (std::vector<float>(4, 1.f)));
}

TEST(Optimizer, UpdatesInPlaceOnTheParamsStorage) {
  SGD opt({.learning_rate = constant_schedule(1.0)});
  Tensor w = Tensor::from_vector<float>({1.f, 2.f}, {2});
  TensorTree params, grads, state;
  params.set("w", w);
  grads.set("w", Tensor::from_vector<float>({0.5f, 0.5f}, {2}));
  opt.update(params, grads, state, 0);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0.5f, 1.5f}));
}

TEST(Adam, MinimisesAQuadratic) {
  // f(w) = sum((w - target)^2); Adam with a decaying schedule reaches the target.
  Tensor target = Tensor::from_vector<float>({1.f, -2.f, 0.5f}, {3});
  TensorTree params;
  params.set("w", Tensor::zeros({3}));
  Adam opt({.learning_rate = cosine_decay_schedule(0.1, 500, 0.01)});
  TensorTree state = opt.init(params);
  auto loss_fn = [&](const TensorTree& p) {
    return tensor::sum(tensor::square(tensor::sub(p.at("w"), target)));
  };
  double loss = 0.0;
  for (int s = 0; s < 500; ++s) {
    auto [l, g] = autodiff::value_and_grad(loss_fn)(params);
    loss = l.item<float>();
    opt.update(params, g, state, s);
  }
  EXPECT_LT(loss, 1e-4);
  expect_near(params.at("w").to_vector<float>(), {1.f, -2.f, 0.5f}, 1e-2f);
}

// The optimizers update all leaves of a tree with the multi-leaf kernels: the same bits as
// the per-leaf update ops on each leaf, over leaves of odd sizes (an empty one, one larger
// than a GPU chunk of 65536 elements) and an AdamW mask that spares some of them.
class MultiLeaf : public ::testing::Test {
 protected:
  // "blocks/0/ln_1/scale" and "b/bias" are not decayed by the default mask; "ids" not trained.
  const std::vector<std::pair<std::string, Shape>> leaves_{
      {"blocks/0/fc/kernel", {3, 17}},
      {"blocks/0/ln_1/scale", {129}},
      {"empty", {0}},
      {"big/kernel", {70001}},
      {"b/bias", {1}},
      {"c/kernel", {4, 4, 5}},
      {"z/kernel", {7}}};  // last in the tree's order, after the empty leaf

  static Tensor values(const Shape& shape, std::uint64_t seed, float scale) {
    std::vector<float> v(static_cast<std::size_t>(numel(shape)));
    random_uniform(Key::from_seed(seed), v.data(), numel(shape), -scale, scale);
    return Tensor::from_vector(v, shape);
  }
  TensorTree params() const {
    TensorTree t;
    for (std::size_t i = 0; i < leaves_.size(); ++i)
      t.set(leaves_[i].first, values(leaves_[i].second, 10 + i, 1.f));
    t.set("ids", Tensor::zeros({3}, DType::I32));
    return t;
  }
  TensorTree grads(int step) const {
    TensorTree t;
    for (std::size_t i = 0; i < leaves_.size(); ++i)
      t.set(leaves_[i].first, values(leaves_[i].second, 100 * step + i, 0.5f));
    return t;
  }
  // got and want hold the same f32 bits (the first difference named otherwise).
  static ::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
    const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
    if (g.size() != w.size())
      return ::testing::AssertionFailure() << g.size() << " vs " << w.size() << " elements";
    for (std::size_t i = 0; i < g.size(); ++i)
      if (std::bit_cast<std::uint32_t>(g[i]) != std::bit_cast<std::uint32_t>(w[i]))
        return ::testing::AssertionFailure()
               << "element " << i << " of " << g.size() << ": " << g[i] << " vs " << w[i];
    return ::testing::AssertionSuccess();
  }
  // Every f32 leaf of `got` (parameters or state) has the bits of `want`'s.
  static void expect_same_bits(const TensorTree& got, const TensorTree& want) {
    ASSERT_EQ(got.paths(), want.paths());
    for (const std::string& path : got.paths())
      if (got.at(path).dtype() == DType::F32) {
        EXPECT_TRUE(same_bits(got.at(path), want.at(path))) << path;
      }
  }
};

TEST_F(MultiLeaf, AdamWMatchesThePerLeafOpBits) {
  const double lr = 0.01, wd = 0.1;
  AdamW opt({.learning_rate = constant_schedule(lr),
             .weight_decay = wd,
             .decay_mask = default_decay_mask()});
  TensorTree p = params(), want = params();
  TensorTree state = opt.init(p), want_state = opt.init(want);
  for (int step = 0; step < 3; ++step) {
    const TensorTree g = grads(step);
    opt.update(p, g, state, step);
    for (const auto& [path, shape] : leaves_)
      tensor::adam_update_(want.at(path), g.at(path), want_state.at("mu/" + path),
                           want_state.at("nu/" + path),
                           {.lr = lr, .t = step + 1, .decay = opt.decays(path) ? 1 - lr * wd : 1});
  }
  expect_same_bits(p, want);
  expect_same_bits(state, want_state);
  EXPECT_FALSE(same_bits(p.at("big/kernel"), params().at("big/kernel")));
}

TEST_F(MultiLeaf, AdamMatchesThePerLeafOpBits) {
  Adam opt({.learning_rate = constant_schedule(0.01), .weight_decay = 0.05});
  TensorTree p = params(), want = params();
  TensorTree state = opt.init(p), want_state = opt.init(want);
  for (int step = 0; step < 3; ++step) {
    const TensorTree g = grads(step);
    opt.update(p, g, state, step);
    for (const auto& [path, shape] : leaves_)
      tensor::adam_update_(want.at(path), g.at(path), want_state.at("mu/" + path),
                           want_state.at("nu/" + path), {.lr = 0.01, .t = step + 1, .l2 = 0.05});
  }
  expect_same_bits(p, want);
  expect_same_bits(state, want_state);
}

TEST_F(MultiLeaf, SgdMatchesThePerLeafOpBits) {
  for (const SGDConfig& config :
       {SGDConfig{.learning_rate = constant_schedule(0.1), .weight_decay = 0.01},
        SGDConfig{.learning_rate = constant_schedule(0.1), .momentum = 0.9, .weight_decay = 0.01},
        SGDConfig{.learning_rate = constant_schedule(0.1), .momentum = 0.9, .nesterov = true}}) {
    SCOPED_TRACE("momentum " + std::to_string(config.momentum));
    SGD opt(config);
    TensorTree p = params(), want = params();
    TensorTree state = opt.init(p), want_state = opt.init(want);
    const tensor::SGDStep step{.lr = 0.1f,
                               .momentum = static_cast<float>(config.momentum),
                               .weight_decay = static_cast<float>(config.weight_decay),
                               .nesterov = config.nesterov};
    for (int s = 0; s < 3; ++s) {
      const TensorTree g = grads(s);
      opt.update(p, g, state, s);
      Tensor none;
      for (const auto& [path, shape] : leaves_)
        tensor::sgd_update_(want.at(path), g.at(path),
                            config.momentum > 0 ? want_state.at("momentum/" + path) : none, step);
    }
    expect_same_bits(p, want);
    expect_same_bits(state, want_state);
  }
}

TEST(Schedules, LinearAndSgdWithoutMomentumHasNoState) {
  EXPECT_DOUBLE_EQ(linear_schedule(0.0, 0.04, 4)(1), 0.01);
  TensorTree params;
  params.set("fc1/kernel", Tensor::ones({2, 2}));
  EXPECT_TRUE(SGD({.learning_rate = constant_schedule(0.01), .momentum = 0.9})
                  .init(params)
                  .contains("momentum/fc1/kernel"));
  EXPECT_TRUE(SGD({}).init(params).empty());
}

}  // namespace
}  // namespace distjax::optim
