// autodiff::grad's on_ready: each cotangent is reported as soon as it is final, before the
// backward pass reaches the layers below, in last-layer-first order, with the same values
// as the returned gradients.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::autodiff {
namespace {

TEST(GradReady, ReportsEachGradientWhenFinalLastLayerFirst) {
  // loss = sum(tanh(tanh(x W0) W1) W2); a marker op between x and the first layer records
  // when the backward pass reaches the bottom.
  TensorTree params;
  const char* names[] = {"w0", "w1", "w2"};
  for (int i = 0; i < 3; ++i)
    params.set(names[i], Tensor::full({4, 4}, 0.1 * (i + 1)));
  const Tensor x = Tensor::ones({2, 4});
  std::vector<std::string> events;
  TensorTree leaves = detail::make_leaves(params);
  Tensor loss;
  {
    tensor::EnableGradGuard on;
    Tensor xin = tensor::make_leaf(x);
    Tensor h = custom_vjp1(
        "marker", {xin}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
        [&](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>& g) {
          events.push_back("bottom");
          return std::vector<Tensor>{g[0]};
        });
    for (int i = 0; i < 3; ++i)
      h = tensor::tanh(tensor::matmul(h, leaves.at(names[i])));
    // w1 is used twice: its gradient is final only after both uses.
    loss = tensor::add(tensor::sum(h), tensor::sum(tensor::mul(leaves.at("w1"), leaves.at("w1"))));
  }
  TensorTree ready;
  TensorTree grads = detail::grads_of(loss, leaves, [&](const std::string& p, const Tensor& g) {
    events.push_back(p);
    ready.set(p, g);
  });
  EXPECT_EQ(events, (std::vector<std::string>{"w2", "w1", "w0", "bottom"}));
  for (const auto& [p, g] : grads)
    EXPECT_EQ(g.to_vector<float>(), ready.at(p).to_vector<float>()) << p;
}

}  // namespace
}  // namespace distjax::autodiff
