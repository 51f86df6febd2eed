// The GPT on the fortunes corpus with fully sharded parameters (ZeRO-3 / FSDP) over a
// ("data"=8) mesh of simulated devices: each device stores 1/8 of every large parameter
// and of its optimizer state, gathers a block's weights when the block runs and again
// when the backward pass recomputes it (remat). --model 2 adds tensor parallelism
// (FSDP x TP). Prints the mesh, per-step loss, validation bits per byte and the bytes each
// device holds.
//
//   ./build/fsdp [--data 8 --model 1 --steps 200 --min-weight-size 16384]
//   mpirun -np 8 ./build/fsdp                    (one process per device)
#include "example_main.hpp"

int main(int argc, char** argv) {
  distjax::examples::DataModelMesh mesh;
  return distjax::examples::example_main(
      argc, argv,
      {.name = "fsdp",
       .about = "the GPT on the fortunes corpus, parameters fully sharded over \"data\"",
       .flags = distjax::examples::gpt_flags(),
       .more = [&](CLI::App& cli) { mesh.add_flags(cli); },
       .adjust = [&](distjax::config::TrainConfig& c) { mesh.apply(c); }});
}
