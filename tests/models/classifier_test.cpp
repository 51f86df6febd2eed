// Classifier: shapes, parameter layout, determinism, dropout and input checks.
#include <gtest/gtest.h>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

const models::ClassifierConfig kSmall{
    .in_features = 20, .hidden = 16, .num_classes = 5, .dropout = 0.5f};

TEST(Classifier, ParamsAndShapes) {
  models::Classifier model(kSmall);
  TensorTree p = model.init(Key::from_seed(0));
  EXPECT_EQ(p.paths(),
            (std::vector<std::string>{"fc1/bias", "fc1/kernel", "fc2/bias", "fc2/kernel"}));
  EXPECT_EQ(p.at("fc1/kernel").shape(), (Shape{20, 16}));
  EXPECT_EQ(p.at("fc2/kernel").shape(), (Shape{16, 5}));
  EXPECT_EQ(p.num_elements(), model.num_params());
  EXPECT_EQ(models::Classifier().num_params(), 784 * 512 + 512 + 512 * 10 + 10);
  const Tensor x = nn::normal(1.0)(Key::from_seed(1), {7, 20});
  const Tensor logits = model.apply(p, x, false, Key{});
  EXPECT_EQ(logits.shape(), (Shape{7, 5}));
  EXPECT_EQ(logits.dtype(), DType::F32);
}

TEST(Classifier, InitIsDeterministic) {
  models::Classifier model(kSmall);
  TensorTree a = model.init(Key::from_seed(3)), b = model.init(Key::from_seed(3)),
             c = model.init(Key::from_seed(4));
  for (auto& [path, t] : a)
    EXPECT_EQ(t.to_vector<float>(), b.at(path).to_vector<float>()) << path;
  EXPECT_NE(a.at("fc1/kernel").to_vector<float>(), c.at("fc1/kernel").to_vector<float>());
  EXPECT_FALSE(a.at("fc1/kernel").requires_grad());  // init records nothing on the tape
}

TEST(Classifier, DropoutOnlyInTrainAndDeterministicByKey) {
  models::Classifier model(kSmall);
  TensorTree p = model.init(Key::from_seed(0));
  const Tensor x = nn::normal(1.0)(Key::from_seed(1), {4, 20});
  auto eval1 = model.apply(p, x, false, Key::from_seed(1)).to_vector<float>();
  auto eval2 = model.apply(p, x, false, Key::from_seed(2)).to_vector<float>();
  auto tr1 = model.apply(p, x, true, Key::from_seed(1)).to_vector<float>();
  auto tr1b = model.apply(p, x, true, Key::from_seed(1)).to_vector<float>();
  auto tr2 = model.apply(p, x, true, Key::from_seed(2)).to_vector<float>();
  EXPECT_EQ(eval1, eval2);
  EXPECT_EQ(tr1, tr1b);
  EXPECT_NE(tr1, tr2);
  EXPECT_NE(tr1, eval1);
}

TEST(Classifier, GradientsReachEveryParameter) {
  models::Classifier model(kSmall);
  TensorTree p = model.init(Key::from_seed(0));
  const Tensor x = nn::normal(1.0)(Key::from_seed(1), {6, 20});
  const Tensor y = Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4, 0}, {6});
  auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& q) {
    return tensor::mean(tensor::cross_entropy(model.apply(q, x, true, Key::from_seed(5)), y));
  })(p);
  EXPECT_GT(loss.item<float>(), 0.f);
  for (auto& [path, t] : g) {
    float mx = 0;
    for (float v : t.to_vector<float>())
      mx = std::max(mx, std::abs(v));
    EXPECT_GT(mx, 0.f) << path;
  }
}

TEST(Classifier, BadInputAndConfigThrow) {
  models::Classifier model(kSmall);
  TensorTree p = model.init(Key::from_seed(0));
  EXPECT_THROW(model.apply(p, Tensor::zeros({3, 21}), false, Key{}), InvalidArgument);
  EXPECT_THROW(model.apply(p, Tensor::zeros({20}), false, Key{}), InvalidArgument);
  EXPECT_THROW(models::Classifier({.hidden = 0}), ConfigError);
  EXPECT_THROW(models::Classifier({.dropout = 1.f}), ConfigError);
}

}  // namespace
