// The C++ side of the Python tests' parity checks, printing numbers as hex floats, one per
// line, so that the tests compare the two bit for bit:
//   reference_program shard_map   test_spmd.py's shard_map program (a local loss and its
//                                 gradient, pmean over "data", a psum over "model", an
//                                 all_gather_invariant): every output element
//   reference_program gpt         test_models.py's training loop (a small GPT, AdamW,
//                                 value_and_grad, 3 steps): the loss of each step
#include <cstdio>
#include <string>
#include <vector>

#include "distjax/distjax.hpp"

using namespace distjax;
using tensor::Tensor;

Tensor values(std::int64_t n, int mul, int mod, int shift, double scale, const Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>(((i * mul) % mod - shift) * scale);
  return Tensor::from_vector(v, shape);
}

int shard_map_program() {
  mesh::Mesh mesh({2, 2}, {"data", "model"});
  const Tensor x = values(48, 7, 13, 6, 1.0 / 8, {8, 6});
  const Tensor w = values(24, 5, 11, 5, 1.0 / 16, {6, 4});
  using mesh::P;
  auto f = spmd::shard_map(
      mesh,
      [](spmd::DeviceContext& ctx, const std::vector<Tensor>& in) {
        const Tensor& xl = in[0];
        tensor::TensorTree p;
        p.set("w", in[1]);
        auto [loss, g] = autodiff::value_and_grad([&](const tensor::TensorTree& t) {
          return tensor::mean(tensor::square(tensor::tanh(tensor::matmul(xl, t.at("w")))));
        })(p);
        Tensor grad = spmd::pmean(ctx, g.at("w"), "data");
        Tensor h = spmd::psum(ctx, tensor::sum(tensor::tanh(tensor::matmul(xl, in[1])), {1}), "model");
        Tensor all = spmd::all_gather_invariant(ctx, h, "data", 0, true);
        Tensor l = spmd::pmean(ctx, spmd::pmean(ctx, loss, "data"), "model");
        return std::vector<Tensor>{grad, h, all, l};
      },
      {P("data", std::nullopt), P(std::nullopt, "model")},
      {P(std::nullopt, "model"), P("data"), P(), P()});
  for (const auto& out : f({x, w}))
    for (float v : mesh::gather(out).to_vector<float>()) std::printf("%a\n", static_cast<double>(v));
  return 0;
}

int gpt_program() {
  const models::Transformer gpt({.vocab = 256, .d_model = 32, .num_layers = 2, .num_heads = 2,
                                 .max_len = 16});
  tensor::TensorTree params = gpt.init(Key::from_seed(0));
  optim::AdamWConfig c;
  c.learning_rate = optim::constant_schedule(1e-2);
  c.weight_decay = 0.1;
  c.decay_mask = optim::default_decay_mask();
  const optim::AdamW adamw(c);
  tensor::TensorTree state = adamw.init(params);
  std::vector<std::int32_t> tokens(64), targets(64);
  for (std::int32_t i = 0; i < 64; ++i) {
    tokens[static_cast<std::size_t>(i)] = (i * 37) % 256;
    targets[static_cast<std::size_t>(i)] = (i * 37 + 37) % 256;
  }
  const Tensor x = Tensor::from_vector(tokens, {4, 16}), y = Tensor::from_vector(targets, {4, 16});
  for (std::int64_t step = 0; step < 3; ++step) {
    auto [loss, grads] = autodiff::value_and_grad([&](const tensor::TensorTree& p) {
      return gpt.loss(nn::Scope::apply(&p, true, Key::from_seed(static_cast<std::uint64_t>(step))),
                      x, y);
    })(params);
    adamw.update(params, grads, state, step);
    std::printf("%a\n", static_cast<double>(loss.item<float>()));
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "shard_map") return shard_map_program();
  if (mode == "gpt") return gpt_program();
  std::fprintf(stderr, "usage: reference_program shard_map|gpt\n");
  return 2;
}
