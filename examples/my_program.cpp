// A model of your own (docs/app.md): an MLP with a LayerNorm on Fashion-MNIST, registered
// and trained by app::train as `distjax train` trains the library's, here from the config
// of data_parallelism: 8 devices, its large parameters fully sharded over "data".
#include "distjax/distjax.hpp"

using namespace distjax;

int main() {
  app::register_model(
      {.name = "my_mlp",
       .about = "an MLP with a LayerNorm on Fashion-MNIST",
       .capabilities = {.shards = {config::Shard::None, config::Shard::Parameters}},
       .epochs = true,
       .build = [](const config::TrainConfig& c, const mesh::Mesh&) {
         app::Model m = app::fashion_mnist_model(c);  // data, evaluation, test accuracy
         m.network = app::network_of(
             [hidden = c.model.hidden](const nn::Scope& s, const Tensor& x) {
               const Tensor h = nn::Dense{.features = hidden}(s.child("fc1"), x);
               const Tensor y = tensor::gelu(nn::LayerNorm{}(s.child("norm"), h));
               return nn::Dense{.features = 10}(s.child("fc2"), y);
             },
             Tensor::zeros({1, 784}));
         return m;
       }});
  config::TrainConfig c = app::builtin_config("data_parallelism");  // [model] hidden = 512
  c.run.program = "my_mlp";
  c.run.steps = 60;
  c.run.out_dir = "runs/my_program";
  c.run.overwrite = true;
  return app::run_main("my_program", [&] { return app::train(c); });
}
