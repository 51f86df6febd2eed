#include "distjax/distjax.hpp"

#include <gtest/gtest.h>

namespace distjax::tensor {
namespace {

TEST(Tensor, FactoriesAndAccess) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.to_vector<float>()[4], 5.f);
  EXPECT_THROW(t.data<std::int32_t>(), InvalidArgument);
  EXPECT_EQ(Tensor::full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5f, 3.5f}));
  EXPECT_EQ(Tensor::arange(3).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2}));
}

// f64 is a comm dtype only: it has a name and a size, no tensor holds it, and a
// checkpoint's dtype name cannot be "f64".
TEST(Tensor, F64IsNotATensorDtype) {
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_STREQ(dtype_name(DType::F64), "f64");
  EXPECT_THROW(Tensor::empty({2}, DType::F64), InvalidArgument);
  EXPECT_THROW(Tensor::zeros({2}, DType::F64), InvalidArgument);
  EXPECT_THROW(dtype_from_name("f64"), InvalidArgument);
  EXPECT_EQ(dtype_from_name("i64"), DType::I64);
}

TEST(Tensor, ViewsShareStorageAndCloneCopies) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor rows = t.view_rows(1, 3);
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
  Tensor c = t.clone();
  c.data<float>()[0] = 42.f;
  EXPECT_EQ(t.data<float>()[0], 1.f);
  rows.data<float>()[0] = 7.f;
  EXPECT_EQ(t.data<float>()[2], 7.f);
}

TEST(Tensor, CastsRoundTrip) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.25f, 1e-3f}, {3});
  Tensor b = astype(t, DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  auto back = astype(b, DType::F32).to_vector<float>();
  EXPECT_FLOAT_EQ(back[0], 1.5f);
  EXPECT_FLOAT_EQ(back[1], -2.25f);
  EXPECT_NEAR(back[2], 1e-3f, 1e-5f);
  auto h = astype(astype(t, DType::F16), DType::F32).to_vector<float>();
  EXPECT_NEAR(h[2], 1e-3f, 1e-6f);
}

TEST(Autodiff, ValueAndGradOfProduct) {
  TensorTree p;
  p.set("w", Tensor::from_vector<float>({0.5f, -1.f, 2.f}, {3}));
  p.set("unused", Tensor::ones({2}));
  Tensor x = Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3});
  auto [loss, grads] = autodiff::value_and_grad(
      [&](const TensorTree& q) { return sum(mul(q.at("w"), mul(q.at("w"), x))); })(p);
  EXPECT_FLOAT_EQ(loss.item<float>(), 0.25f + 2.f + 12.f);
  EXPECT_EQ(grads.at("w").to_vector<float>(), (std::vector<float>{1.f, -4.f, 12.f}));
  EXPECT_EQ(grads.at("unused").to_vector<float>(), (std::vector<float>{0.f, 0.f}));
  EXPECT_FALSE(loss.requires_grad());
}

TEST(Autodiff, MatmulBroadcastAndLinear) {
  TensorTree p;
  p.set("w", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  p.set("b", Tensor::from_vector<float>({0.5f, -0.5f}, {2}));
  Tensor x = Tensor::from_vector<float>({1, 0, -1, 2, 1, 0}, {2, 3});
  auto f = [&](const TensorTree& q) { return sum(linear(x, q.at("w"), q.at("b"))); };
  auto g = [&](const TensorTree& q) { return sum(add(matmul(x, q.at("w")), q.at("b"))); };
  auto [l1, g1] = autodiff::value_and_grad(f)(p);
  auto [l2, g2] = autodiff::value_and_grad(g)(p);
  EXPECT_FLOAT_EQ(l1.item<float>(), l2.item<float>());
  EXPECT_EQ(g1.at("w").to_vector<float>(), g2.at("w").to_vector<float>());
  EXPECT_EQ(g1.at("b").to_vector<float>(), (std::vector<float>{2.f, 2.f}));
}

TEST(Autodiff, CheckpointMatchesPlainGradient) {
  TensorTree p;
  p.set("w", Tensor::from_vector<float>({0.1f, 0.2f, -0.3f, 0.4f}, {2, 2}));
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  auto block = [](const TensorTree& q, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(matmul(in[0], q.at("w")))};
  };
  auto plain = [&](const TensorTree& q) { return sum(square(block(q, {x})[0])); };
  auto remat = [&](const TensorTree& q) {
    return sum(square(autodiff::checkpoint(block, q, {x})[0]));
  };
  auto [l1, g1] = autodiff::value_and_grad(plain)(p);
  auto [l2, g2] = autodiff::value_and_grad(remat)(p);
  EXPECT_FLOAT_EQ(l1.item<float>(), l2.item<float>());
  auto a = g1.at("w").to_vector<float>(), b = g2.at("w").to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_FLOAT_EQ(a[i], b[i]);
}

TEST(Autodiff, CustomVjpUsesGivenRule) {
  TensorTree p;
  p.set("x", Tensor::from_vector<float>({1.f, 2.f}, {2}));
  // Forward is identity; the custom backward scales by 3.
  auto f = [](const TensorTree& q) {
    Tensor y = autodiff::custom_vjp1(
        "scale3", {q.at("x")},
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].clone()}; },
        [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
          return std::vector<Tensor>{mul_scalar(g[0], 3.0)};
        });
    return sum(y);
  };
  auto g = autodiff::grad(f)(p);
  EXPECT_EQ(g.at("x").to_vector<float>(), (std::vector<float>{3.f, 3.f}));
}

// The shapes of the op set docs/tensor-and-autodiff.md lists (the page's snippet runs a few
// of them; the rest are here).
TEST(Tensor, ShapesOfTheOpSet) {
  Tensor a = Tensor::ones({2, 3, 4});
  EXPECT_EQ((a * 2.0 + 1.0).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(permute(a, {2, 0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(slice(a, 2, 1, 3).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(concat({a, a}, 1).shape(), (Shape{2, 6, 4}));
  EXPECT_EQ(split(a, 2, -1)[1].shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(split(a, std::vector<std::int64_t>{1, 3}, 2)[1].shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(stack({a, a}, 0).shape(), (Shape{2, 2, 3, 4}));
  EXPECT_EQ(broadcast_to(Tensor::ones({3, 1}), {2, 3, 4}).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(sum(a).shape(), (Shape{}));
  EXPECT_EQ(max(a, {1}).shape(), (Shape{2, 4}));
  EXPECT_EQ(argmax(a, -1).dtype(), DType::I64);
  EXPECT_EQ(sum_to(a, {3, 1}).shape(), (Shape{3, 1}));
  EXPECT_EQ(sum_to(a, {3, 1}).to_vector<float>(), (std::vector<float>{8.f, 8.f, 8.f}));

  Tensor x = Tensor::ones({5, 3});
  EXPECT_EQ(matmul(x, Tensor::ones({3, 7})).shape(), (Shape{5, 7}));
  EXPECT_EQ(matmul(x, Tensor::ones({7, 3}), false, /*trans_b=*/true).shape(), (Shape{5, 7}));
  EXPECT_EQ(linear(x, Tensor::ones({3, 7}), Tensor::zeros({7})).shape(), (Shape{5, 7}));

  Tensor logits = Tensor::zeros({4, 10});
  EXPECT_EQ(softmax(logits).shape(), (Shape{4, 10}));
  EXPECT_EQ(layer_norm(logits, Tensor::ones({10}), Tensor()).shape(), (Shape{4, 10}));
  EXPECT_EQ(rms_norm(logits, Tensor::ones({10})).shape(), (Shape{4, 10}));
  EXPECT_EQ(embedding(Tensor::ones({256, 8}), Tensor::arange(5)).shape(), (Shape{5, 8}));
  EXPECT_EQ(dropout(x, 0.5f, Key::from_seed(0)).shape(), (Shape{5, 3}));
  EXPECT_EQ(where(Tensor::ones({3}), Tensor::ones({3}), Tensor::zeros({3})).to_vector<float>(),
            (std::vector<float>{1.f, 1.f, 1.f}));
}

}  // namespace
}  // namespace distjax::tensor
