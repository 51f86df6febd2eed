// A tiny program built against the installed package: one gradient step.
#include <distjax/distjax.hpp>

#include <cstdio>

int main() {
  using namespace distjax;
  Tensor x = Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3});
  TensorTree params;
  params.set("w", Tensor::from_vector<float>({0.5f, -1.f, 2.f}, {3}));
  auto [loss, grads] = autodiff::value_and_grad(
      [&](const TensorTree& p) { return tensor::sum(tensor::mul(p.at("w"), x)); })(params);
  // d/dw sum(w * x) = x.
  bool ok = grads.at("w").to_vector<float>() == x.to_vector<float>() && loss.item<float>() == 4.5f;
  std::printf(ok ? "consumer ok\n" : "consumer FAILED\n");
  return ok ? 0 : 1;
}
