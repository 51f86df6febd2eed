// Golden test: the Classifier and the GPT Transformer against PyTorch (float64) on
// the parameters and inputs stored in tests/golden/fixture.txt (made by
// make_fixture.py). Loss, logits and every parameter gradient must match within
// max|diff| <= 1e-5 * max|reference| per tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

constexpr double kRelTol = 1e-5;

struct Record {
  std::string dtype;
  Shape shape;
  std::vector<double> values;  // parsed with strtod, as numpy does before float32()
};

std::map<std::string, Record> load_fixture() {
  const std::string path = std::string(DISTJAX_SOURCE_DIR) + "/tests/golden/fixture.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("# distjax-golden v1 ", 0), 0u) << "unexpected header: " << line;
  std::map<std::string, Record> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream head(line);
    std::string name;
    Record r;
    int rank = 0;
    head >> name >> r.dtype >> rank;
    r.shape.resize(static_cast<std::size_t>(rank));
    for (auto& d : r.shape)
      head >> d;
    std::string vals;
    std::getline(in, vals);
    const char* p = vals.c_str();
    char* end = nullptr;
    const std::int64_t n = distjax::numel(r.shape);
    r.values.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      r.values.push_back(std::strtod(p, &end));
      EXPECT_NE(p, end) << "short record " << name;
      p = end;
    }
    out.emplace(name, std::move(r));
  }
  return out;
}

const std::map<std::string, Record>& fixture() {
  static const auto f = load_fixture();
  return f;
}

Tensor to_f32(const Record& r) {
  std::vector<float> v(r.values.begin(), r.values.end());  // double -> float, as numpy
  return Tensor::from_vector(v, r.shape);
}

Tensor to_i64(const Record& r) {
  std::vector<std::int64_t> v;
  for (double x : r.values)
    v.push_back(static_cast<std::int64_t>(x));
  return Tensor::from_vector(v, r.shape);
}

// Parameters "<model>/param/<path>" as a tree keyed by <path>.
TensorTree params_of(const std::string& model) {
  const std::string pre = model + "/param/";
  TensorTree t;
  for (auto& [name, r] : fixture())
    if (name.rfind(pre, 0) == 0) t.set(name.substr(pre.size()), to_f32(r));
  return t;
}

void expect_close(const std::string& what, const Tensor& got, const Record& ref) {
  ASSERT_EQ(got.shape(), ref.shape) << what;
  std::vector<float> g = got.to_vector<float>();
  double max_ref = 0, max_diff = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(ref.values[i]));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(g[i]) - ref.values[i]));
  }
  EXPECT_GT(max_ref, 0.0) << what << ": the reference is all zeros, the check would be empty";
  EXPECT_LE(max_diff, kRelTol * max_ref)
      << what << ": max|diff| " << max_diff << ", max|ref| " << max_ref;
}

TEST(Golden, FixtureIsPresent) {
  EXPECT_EQ(fixture().count("mlp/output/loss"), 1u);
  EXPECT_EQ(fixture().count("gpt/output/loss"), 1u);
  EXPECT_EQ(fixture().count("gpt_small/output/loss"), 1u);
}

TEST(Golden, ClassifierMatchesPyTorch) {
  const auto& f = fixture();
  models::Classifier model({.in_features = 16, .hidden = 32, .num_classes = 4, .dropout = 0.f});
  TensorTree params = params_of("mlp");
  // The fixture's paths are exactly the model's.
  ASSERT_TRUE(params.same_structure(model.init(Key::from_seed(0))));
  const Tensor x = to_f32(f.at("mlp/input/x"));
  const Tensor labels = to_i64(f.at("mlp/input/labels"));

  expect_close("mlp logits", model.apply(params, x, false, Key{}), f.at("mlp/output/logits"));
  auto loss_fn = [&](const TensorTree& p) {
    return tensor::mean(tensor::cross_entropy(model.apply(p, x, false, Key{}), labels));
  };
  auto [loss, grads] = autodiff::value_and_grad(loss_fn)(params);
  expect_close("mlp loss", loss, f.at("mlp/output/loss"));
  ASSERT_EQ(grads.size(), 4u);
  for (auto& [path, g] : grads)
    expect_close("mlp grad " + path, g, f.at("mlp/grad/" + path));
}

// Runs `model` with the fixture's parameters `name/param/...` on its tokens and compares
// logits (when `check_logits`), loss and every parameter gradient with the fixture.
void expect_transformer_matches(const models::Transformer& model, const std::string& name,
                                bool check_logits = true) {
  const auto& f = fixture();
  TensorTree params = params_of(name);
  // The fixture's paths are exactly the model's.
  ASSERT_TRUE(params.same_structure(model.init(Key::from_seed(0))));
  const Tensor tokens = to_i64(f.at(name + "/input/tokens"));
  const Tensor targets = to_i64(f.at(name + "/input/targets"));
  if (check_logits)
    expect_close(name + " logits", model.apply(params, tokens, false, Key{}),
                 f.at(name + "/output/logits"));
  auto loss_fn = [&](const TensorTree& p) {
    return tensor::mean(tensor::cross_entropy(model.apply(p, tokens, false, Key{}), targets));
  };
  auto [loss, grads] = autodiff::value_and_grad(loss_fn)(params);
  expect_close(name + " loss", loss, f.at(name + "/output/loss"));
  ASSERT_EQ(grads.size(), params.size());
  for (auto& [path, g] : grads)
    expect_close(name + " grad " + path, g, f.at(name + "/grad/" + path));
}

TEST(Golden, TransformerMatchesPyTorch) {
  expect_transformer_matches(models::Transformer({.vocab = 32,
                                                  .d_model = 32,
                                                  .num_layers = 2,
                                                  .num_heads = 2,
                                                  .mlp_ratio = 4,
                                                  .max_len = 8,
                                                  .learned_positions = true,
                                                  .tied_embeddings = true,
                                                  .dropout = 0.f,
                                                  .remat = false,
                                                  .ln_eps = 1e-5f}),
                             "gpt");
}

// Sinusoidal positions, untied lm_head, 4 heads of width 4, mlp_ratio 2.
TEST(Golden, SmallUntiedSinusoidalTransformerMatchesPyTorch) {
  expect_transformer_matches(models::Transformer({.vocab = 16,
                                                  .d_model = 16,
                                                  .num_layers = 1,
                                                  .num_heads = 4,
                                                  .mlp_ratio = 2,
                                                  .max_len = 6,
                                                  .learned_positions = false,
                                                  .tied_embeddings = false}),
                             "gpt_small");
}

// Rematerialised blocks recompute activations in the backward pass: same numbers.
TEST(Golden, TransformerWithRematMatchesPyTorch) {
  expect_transformer_matches(models::Transformer({.vocab = 32,
                                                  .d_model = 32,
                                                  .num_layers = 2,
                                                  .num_heads = 2,
                                                  .mlp_ratio = 4,
                                                  .max_len = 8,
                                                  .remat = true}),
                             "gpt", /*check_logits=*/false);
}

}  // namespace
