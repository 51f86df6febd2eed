// The module system: deterministic init by path, Apply-mode lookups and their errors,
// child keys, sharding metadata and rebased scopes.
#include <gtest/gtest.h>

#include "distjax/nn/dense.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/tensor.hpp"

namespace {

using namespace distjax;
using nn::Scope;
using tensor::Tensor;
using tensor::TensorTree;

// A two-layer toy module: "a" Dense(3) then "b" Dense(2).
Tensor toy(const Scope& s, const Tensor& x) {
  Tensor h = nn::Dense{.features = 3}(s.child("a"), x);
  return nn::Dense{.features = 2, .kernel_spec = mesh::P(std::nullopt, "model")}(s.child("b"), h);
}

TensorTree init_toy(Key key, nn::ParamSpecs* specs = nullptr) {
  TensorTree p;
  toy(Scope::init(&p, key, specs), Tensor::zeros({1, 4}));
  return p;
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

TEST(Scope, InitCreatesPathsAndShapes) {
  TensorTree p = init_toy(Key::from_seed(0));
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"a/bias", "a/kernel", "b/bias", "b/kernel"}));
  EXPECT_EQ(p.at("a/kernel").shape(), (Shape{4, 3}));
  EXPECT_EQ(p.at("a/bias").shape(), (Shape{3}));
  EXPECT_EQ(p.at("b/kernel").shape(), (Shape{3, 2}));
  // Biases start at zero, kernels do not.
  for (float v : p.at("b/bias").to_vector<float>())
    EXPECT_EQ(v, 0.f);
  bool nonzero = false;
  for (float v : p.at("a/kernel").to_vector<float>())
    nonzero |= v != 0.f;
  EXPECT_TRUE(nonzero);
}

TEST(Scope, SameKeySameParamsDifferentKeyDifferent) {
  TensorTree p1 = init_toy(Key::from_seed(7));
  TensorTree p2 = init_toy(Key::from_seed(7));
  TensorTree p3 = init_toy(Key::from_seed(8));
  for (auto& [path, t] : p1)
    EXPECT_TRUE(equal(t, p2.at(path))) << path;
  EXPECT_FALSE(equal(p1.at("a/kernel"), p3.at("a/kernel")));
  EXPECT_FALSE(equal(p1.at("b/kernel"), p3.at("b/kernel")));
}

TEST(Scope, ParamsDependOnPathNotOrder) {
  // Creating "b" before "a" gives the same values: keys are folded from the path.
  TensorTree fwd = init_toy(Key::from_seed(3));
  TensorTree rev;
  Scope s = Scope::init(&rev, Key::from_seed(3));
  nn::Dense{.features = 2}(s.child("b"), Tensor::zeros({1, 3}));
  nn::Dense{.features = 3}(s.child("a"), Tensor::zeros({1, 4}));
  for (auto& [path, t] : fwd)
    EXPECT_TRUE(equal(t, rev.at(path))) << path;
  // Two layers of the same shape under different names differ.
  TensorTree q;
  Scope r = Scope::init(&q, Key::from_seed(3));
  nn::Dense{.features = 4}(r.child("x"), Tensor::zeros({1, 4}));
  nn::Dense{.features = 4}(r.child("y"), Tensor::zeros({1, 4}));
  EXPECT_FALSE(equal(q.at("x/kernel"), q.at("y/kernel")));
}

TEST(Scope, ApplyReadsTheTree) {
  TensorTree p = init_toy(Key::from_seed(1));
  Scope s = Scope::apply(&p, false);
  EXPECT_EQ(s.mode(), nn::Mode::Apply);
  Tensor k = s.child("a").param("kernel", {4, 3}, nn::zeros());
  EXPECT_TRUE(k.shares_storage_with(p.at("a/kernel")));
  EXPECT_EQ(toy(s, Tensor::ones({5, 4})).shape(), (Shape{5, 2}));
}

TEST(Scope, ApplyMissingParamNamesThePath) {
  TensorTree p = init_toy(Key::from_seed(1));
  p.erase("b/kernel");
  Scope s = Scope::apply(&p, false);
  try {
    toy(s, Tensor::ones({1, 4}));
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("\"b/kernel\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(Scope, ApplyShapeMismatchNamesPathAndShapes) {
  TensorTree p = init_toy(Key::from_seed(1));
  Scope s = Scope::apply(&p, false);
  try {
    toy(s, Tensor::ones({1, 5}));  // a/kernel is (4, 3), the input asks for (5, 3)
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("\"a/kernel\""), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(5, 3)"), std::string::npos) << m;
  }
}

TEST(Scope, InitReuseSharesAndShapeConflictThrows) {
  TensorTree p;
  Scope s = Scope::init(&p, Key::from_seed(0));
  Tensor a = s.param("w", {2, 2}, nn::lecun_normal());
  Tensor b = s.param("w", {2, 2}, nn::lecun_normal());
  EXPECT_TRUE(a.shares_storage_with(b));
  EXPECT_THROW(s.param("w", {3, 2}, nn::lecun_normal()), InvalidArgument);
  EXPECT_THROW(s.child("bad/name"), InvalidArgument);
  EXPECT_THROW(s.child(""), InvalidArgument);
}

TEST(Scope, ChildPathsAndDropoutKeys) {
  TensorTree p;
  Scope root = Scope::apply(&p, true, Key::from_seed(5));
  Scope a = root.child("blocks").child(0).child("attn");
  EXPECT_EQ(a.path(), "blocks/0/attn");
  EXPECT_EQ(a.full_path("kernel"), "blocks/0/attn/kernel");
  EXPECT_TRUE(a.train());
  EXPECT_EQ(root.child("x").dropout_key(), Key::from_seed(5).fold_in(std::string_view("x")));
  EXPECT_NE(root.child("x").dropout_key(), root.child("y").dropout_key());
  EXPECT_EQ(root.child("x").dropout_key(), root.child("x").dropout_key());
}

TEST(Scope, SpecsRecordedAtInit) {
  nn::ParamSpecs specs;
  init_toy(Key::from_seed(0), &specs);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs.at("b/kernel"), mesh::P(std::nullopt, "model"));
  TensorTree p;
  Scope s = Scope::init(&p, Key::from_seed(0), &specs);
  // A spec with more entries than the parameter has dimensions.
  EXPECT_THROW(s.param("w", {2}, nn::zeros(), mesh::P("model", std::nullopt)), ShardingError);
}

TEST(Scope, RebasedScopeReadsASubtree) {
  TensorTree p = init_toy(Key::from_seed(2));
  Scope b = Scope::apply(&p, false).child("b");
  TensorTree sub = b.params();
  EXPECT_EQ(sub.paths(), (std::vector<std::string>{"bias", "kernel"}));
  Scope rb = b.rebased(&sub);
  EXPECT_EQ(rb.path(), "b");
  Tensor k = rb.param("kernel", {3, 2}, nn::zeros());
  EXPECT_TRUE(k.shares_storage_with(p.at("b/kernel")));
  EXPECT_EQ(rb.dropout_key(), b.dropout_key());
  // Nested children of a rebased scope resolve relative to the subtree.
  TensorTree whole = init_toy(Key::from_seed(2));
  Scope root = Scope::apply(&whole, false);
  TensorTree all = root.params();
  EXPECT_EQ(all.size(), 4u);
  Scope r2 = root.rebased(&all);
  EXPECT_TRUE(
      r2.child("a").param("bias", {3}, nn::zeros()).shares_storage_with(whole.at("a/bias")));
}

}  // namespace
