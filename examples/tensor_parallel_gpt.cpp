// The tensor-parallel GPT on the fortunes corpus over a ("data"=2, "model"=4) mesh of 8
// simulated devices: Megatron by default (--sequence-parallel 1, --vocab-parallel 1), or
// --layout gather / async (--bidirectional 1). Prints the mesh, per-step loss and the
// validation bits per byte.
//
//   ./build/tensor_parallel_gpt [--layout megatron --data 2 --model 4 --steps 200]
//   mpirun -np 8 ./build/tensor_parallel_gpt      (one process per device)
#include "example_main.hpp"

int main(int argc, char** argv) {
  distjax::examples::DataModelMesh mesh;
  return distjax::examples::example_main(
      argc, argv,
      {.name = "tensor_parallel_gpt",
       .about = "the GPT on the fortunes corpus over a (data, model) mesh",
       .flags = distjax::examples::gpt_flags(),
       .more = [&](CLI::App& cli) { mesh.add_flags(cli); },
       .adjust = [&](distjax::config::TrainConfig& c) { mesh.apply(c); }});
}
