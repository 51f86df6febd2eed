// A Vision Transformer on Fashion-MNIST, a model registered from outside the library
// (docs/app.md): each image cut into 16 patches of 7 x 7 pixels, a pre-norm encoder
// (models::Transformer with causal = false, input_features and num_classes), trained by
// app::train from a TOML file over data x tensor x pipeline parallelism.
//
//   ./build/vit examples/vit.toml [run.steps=100 ...]     (key=value: config keys)
#include <algorithm>
#include <string>
#include <vector>

#include "distjax/distjax.hpp"

using namespace distjax;

// (B, 784) images -> (B, 16, 49): a 4 x 4 grid of 7 x 7 patches, row by row.
train::Batch patches(train::Batch b) {
  const std::int64_t n = b.inputs.size(0);
  const Tensor grid = tensor::reshape(b.inputs, {n, 4, 7, 4, 7});
  b.inputs = tensor::reshape(tensor::permute(grid, {0, 1, 3, 2, 4}), {n, 16, 49});
  return b;
}

app::Model vit(const config::TrainConfig& c, const mesh::Mesh&) {
  // clang-format off
  const auto encoder = std::make_shared<models::Transformer>(models::TransformerConfig{
      .d_model = c.model.d_model, .num_layers = c.model.layers, .num_heads = c.model.heads,
      .max_len = 16, .tied_embeddings = false, .dropout = static_cast<float>(c.model.dropout),
      .causal = false, .input_features = 49, .num_classes = 10});
  // clang-format on
  app::Model m = app::fashion_mnist_model(c, /*pipelined=*/true);  // data, test accuracy
  m.network = app::transformer_network(encoder);  // owns it, its stages, its TP layouts
  m.description = "ViT 16 patches, C=" + std::to_string(c.model.d_model) +
                  " L=" + std::to_string(c.model.layers);
  m.data = [images = m.data](const app::DevicePlace& place) {
    app::DeviceData d = images(place);
    d.batch = [batch = d.batch](std::int64_t step) { return patches(batch(step)); };
    for (train::Batch& b : d.eval)
      b = patches(b);
    return d;
  };
  return m;
}

int main(int argc, char** argv) {
  app::register_model({.name = "vit",
                       .about = "a Vision Transformer on Fashion-MNIST patches",
                       .axes = {"data", "model"},
                       .capabilities = {.tensor_parallel = true, .pipeline_parallel = true},
                       .epochs = true,
                       .build = vit});
  const std::vector<std::string> sets(argv + std::min(argc, 2), argv + argc);
  return app::run_main("vit", [&] {
    const std::string file = argc > 1 ? argv[1] : "examples/vit.toml";
    return app::train(config::load_config(file, sets), file);
  });
}
