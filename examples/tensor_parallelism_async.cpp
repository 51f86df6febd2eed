// The toolkit's tensor_parallelism_async example: the TP classifier (3 blocks, hidden 512) on
// Fashion-MNIST on a
// ("data"=2, "model"=4) mesh of 8 simulated devices, its gathers and reduce-scatters run as
// ppermute rings overlapped with the matmuls (TPAsyncDense; --bidirectional 1 for rings both ways).
// Prints the mesh, the loss of every run.log_every steps, then the test accuracy. The model
// is "tp_classifier", trained by app::train.
//
//   ./build/tensor_parallelism_async [--data 2 --model 4 --steps 300]
//   mpirun -np 8 ./build/tensor_parallelism_async          (one process per device)
#include "example_main.hpp"

int main(int argc, char** argv) {
  distjax::examples::DataModelMesh mesh;
  return distjax::examples::example_main(
      argc, argv,
      {.name = "tensor_parallelism_async",
       .about = "the TP classifier on Fashion-MNIST with async TP rings",
       .flags = distjax::examples::tp_classifier_flags(),
       .more = [&](CLI::App& cli) { mesh.add_flags(cli); },
       .adjust = [&](distjax::config::TrainConfig& c) { mesh.apply(c); }});
}
