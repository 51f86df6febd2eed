// Determinism and resumption: a run interrupted after k steps and continued from its
// TrainState and loader position ends exactly where an uninterrupted run ends.
#include <gtest/gtest.h>

#include "distjax/data/loader.hpp"
#include "distjax/data/synthetic.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::train {
namespace {

TensorTree copy(const TensorTree& t) {
  return t.map([](const Tensor& x) { return x.clone(); });
}

TrainState copy(const TrainState& s) {
  return TrainState{s.step, copy(s.params), copy(s.opt_state), s.rng, s.loss_scale};
}

struct Experiment {
  models::Classifier model{{.in_features = 10, .hidden = 16, .num_classes = 3, .dropout = 0.2f}};
  optim::AdamW opt{{.learning_rate = optim::warmup_cosine_schedule(0.0, 0.01, 3, 20)}};
  data::ArrayDataset data = data::synthetic_classification(40, 10, 3, Key::from_seed(5));
  LossFn loss = [this](const TensorTree& p, const Batch& b, Key k) {
    Tensor logits = model.apply(p, b.inputs, true, k);  // dropout: the key matters
    return std::make_pair(tensor::mean(tensor::cross_entropy(logits, b.labels)), Metrics{});
  };
  TrainState fresh() const {
    return TrainState::create(model.init(Key::from_seed(1)), opt, Key::from_seed(2));
  }
};

void expect_equal(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.paths(), b.paths());
  for (const auto& [path, t] : a)
    EXPECT_EQ(t.to_vector<float>(), b.at(path).to_vector<float>()) << path;
}

TEST(Resume, InterruptedRunMatchesUninterrupted) {
  Experiment s;
  // Uninterrupted: 12 steps (batches of 8 from 40 examples: 2.4 epochs).
  TrainState a = s.fresh();
  data::DataLoader la(s.data, {.batch_size = 8, .seed = 3});
  for (int i = 0; i < 12; ++i)
    train_step(a, la.next(), s.loss, s.opt, {.num_minibatches = 2});

  // Interrupted after 7 steps: keep a copy of the state and the loader position only.
  TrainState b = s.fresh();
  data::DataLoader lb(s.data, {.batch_size = 8, .seed = 3});
  for (int i = 0; i < 7; ++i)
    train_step(b, lb.next(), s.loss, s.opt, {.num_minibatches = 2});
  TrainState saved = copy(b);
  const data::LoaderPosition pos = lb.position();

  TrainState c = copy(saved);
  data::DataLoader lc(s.data, {.batch_size = 8, .seed = 3});
  lc.seek(pos);
  for (int i = 0; i < 5; ++i)
    train_step(c, lc.next(), s.loss, s.opt, {.num_minibatches = 2});

  EXPECT_EQ(c.step, 12);
  expect_equal(c.params, a.params);
  expect_equal(c.opt_state, a.opt_state);

  // And the check can fail: a different loader seed gives different parameters.
  TrainState d = copy(saved);
  data::DataLoader ld(s.data, {.batch_size = 8, .seed = 4});
  ld.seek(pos);
  for (int i = 0; i < 5; ++i)
    train_step(d, ld.next(), s.loss, s.opt, {.num_minibatches = 2});
  EXPECT_NE(d.params.at("fc1/kernel").to_vector<float>(),
            a.params.at("fc1/kernel").to_vector<float>());
}

}  // namespace
}  // namespace distjax::train
