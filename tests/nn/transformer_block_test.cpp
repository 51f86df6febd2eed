// TransformerBlock: parameter layout, the pre-norm residual formula (its residual adds made
// in the out projections' products), and remat (checkpoint) giving the same values and
// gradients as the plain block, with dropout on.
#include <gtest/gtest.h>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/nn/multi_head_attention.hpp"
#include "distjax/nn/transformer_block.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"

namespace {

using namespace distjax;
using nn::Scope;
using tensor::Tensor;
using tensor::TensorTree;

TEST(TransformerBlock, ParamLayout) {
  TensorTree p;
  const Tensor x = nn::normal(1.0)(Key::from_seed(1), {2, 4, 16});
  nn::TransformerBlock{.num_heads = 4}(Scope::init(&p, Key::from_seed(0)), x);
  EXPECT_EQ(p.paths(), (std::vector<std::string>{
                           "attn/out/bias", "attn/out/kernel", "attn/qkv/bias", "attn/qkv/kernel",
                           "ln1/bias", "ln1/scale", "ln2/bias", "ln2/scale", "mlp/fc1/bias",
                           "mlp/fc1/kernel", "mlp/fc2/bias", "mlp/fc2/kernel"}));
  EXPECT_EQ(p.at("mlp/fc1/kernel").shape(), (Shape{16, 64}));
}

// Without dropout the block adds its residuals in the out projections' products
// (tensor::LinearEpilogue::residual): still y = x + attn(ln1(x)), y + mlp(ln2(y)) from the
// sub-modules, bit for bit, forward and backward, with and without remat.
TEST(TransformerBlock, IsThePreNormResidualFormula) {
  const Tensor x = nn::normal(1.0)(Key::from_seed(3), {2, 6, 16});
  const Tensor w = nn::normal(1.0)(Key::from_seed(4), {2, 6, 16});
  TensorTree params;
  const nn::TransformerBlock block{.num_heads = 2};
  block(Scope::init(&params, Key::from_seed(0)), x);
  params.set("x", x);
  auto formula = [&](const TensorTree& p) {
    const Scope s = Scope::apply(&p, true, Key::from_seed(5));
    const nn::LayerNorm ln{.eps = block.ln_eps};
    const Tensor& in = p.at("x");
    const Tensor y = tensor::add(
        in, nn::MultiHeadAttention{.num_heads = 2}(s.child("attn"), ln(s.child("ln1"), in)));
    const Tensor z = tensor::add(y, nn::MLPBlock{}(s.child("mlp"), ln(s.child("ln2"), y)));
    return tensor::sum(tensor::mul(z, w));
  };
  auto [lw, gw] = autodiff::value_and_grad(formula)(params);
  nn::TransformerBlock remat = block, both = block;
  remat.remat = true;
  both.remat_attn = both.remat_mlp = true;
  for (const auto& [name, blk] :
       {std::pair{"plain", block}, std::pair{"remat", remat}, std::pair{"attn+mlp", both}}) {
    SCOPED_TRACE(name);
    auto [l, g] = autodiff::value_and_grad([&, blk = blk](const TensorTree& p) {
      const Scope s = Scope::apply(&p, true, Key::from_seed(5));
      return tensor::sum(tensor::mul(blk(s, p.at("x")), w));
    })(params);
    EXPECT_EQ(l.item<float>(), lw.item<float>());
    for (const auto& [path, gp] : gw)
      EXPECT_EQ(g.at(path).to_vector<float>(), gp.to_vector<float>()) << path;
  }
}

TEST(TransformerBlock, RematGivesSameValuesAndGradients) {
  const Tensor x = nn::normal(1.0)(Key::from_seed(1), {2, 6, 16});
  const Tensor w = nn::normal(1.0)(Key::from_seed(2), {2, 6, 16});  // weights the output
  TensorTree params;
  nn::TransformerBlock plain{.num_heads = 2, .dropout = 0.2f};
  nn::TransformerBlock remat = plain;
  remat.remat = true;
  // Nested under a path, as in the model, to exercise the rebased scope.
  plain(Scope::init(&params, Key::from_seed(0)).child("blocks").child(0), x);
  params.set("x", x);  // differentiate with respect to the block input too

  auto loss_with = [&](const nn::TransformerBlock& blk) {
    return [&, blk](const TensorTree& p) {
      const Scope s = Scope::apply(&p, /*train=*/true, Key::from_seed(42));
      Tensor y = blk(s.child("blocks").child(0), p.at("x"));
      Tensor y2 = blk(s.child("blocks").child(0), tensor::tanh(y));  // applied twice
      return tensor::sum(tensor::mul(y2, w));
    };
  };
  auto [l1, g1] = autodiff::value_and_grad(loss_with(plain))(params);
  // The whole block, only its attention ("Attn"), only its MLP ("MLP"), both.
  nn::TransformerBlock attn = plain, mlp = plain, both = plain;
  attn.remat_attn = true;
  mlp.remat_mlp = true;
  both.remat_attn = both.remat_mlp = true;
  for (const auto& [name, blk] : {std::pair{"block", remat}, std::pair{"attn", attn},
                                  std::pair{"mlp", mlp}, std::pair{"attn+mlp", both}}) {
    auto [l2, g2] = autodiff::value_and_grad(loss_with(blk))(params);
    EXPECT_FLOAT_EQ(l1.item<float>(), l2.item<float>()) << name;
    ASSERT_TRUE(g1.same_structure(g2));
    for (auto& [path, g] : g1) {
      auto a = g.to_vector<float>(), b = g2.at(path).to_vector<float>();
      double mx = 0;
      for (float v : a)
        mx = std::max(mx, double(std::abs(v)));
      EXPECT_GT(mx, 0.0) << path;
      for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + mx)) << name << " " << path << " " << i;
    }
  }
  // What the forward keeps for backward: rematerialised sub-modules keep only their input.
  auto kept_by = [&](const nn::TransformerBlock& blk) {
    const TensorTree leaves = autodiff::detail::make_leaves(params);
    const std::int64_t before = tensor::live_bytes();
    tensor::EnableGradGuard on;
    Tensor y = blk(Scope::apply(&leaves, true, Key::from_seed(42)).child("blocks").child(0),
                   leaves.at("x"));
    return tensor::live_bytes() - before;
  };
  const std::int64_t kept_plain = kept_by(plain);
  EXPECT_LT(kept_by(mlp), kept_plain);
  EXPECT_LT(kept_by(attn), kept_plain);
  EXPECT_LT(kept_by(both), kept_by(mlp));
  EXPECT_LT(kept_by(remat), kept_by(both));
  // Dropout is really on: eval mode changes the value.
  auto eval = [&](const TensorTree& p) {
    return tensor::sum(tensor::mul(plain(Scope::apply(&p, false).child("blocks").child(0), x), w));
  };
  auto train_once = [&](const TensorTree& p) {
    return tensor::sum(tensor::mul(
        plain(Scope::apply(&p, true, Key::from_seed(42)).child("blocks").child(0), x), w));
  };
  EXPECT_NE(eval(params).item<float>(), train_once(params).item<float>());
}

}  // namespace
