// The tensor-parallel GPT on the fortunes corpus over a ("data"=2, "model"=4) mesh of 8
// simulated devices: Megatron by default (--sequence-parallel 1, --vocab-parallel 1), or
// --layout gather / async (--bidirectional 1). Prints the mesh, per-step loss and the
// validation bits per byte.
//
//   ./build/tensor_parallel_gpt [--layout megatron --data 2 --model 4 --steps 200]
//   mpirun -np 8 ./build/tensor_parallel_gpt      (one process per device)
#include "gpt_example.hpp"

int main(int argc, char** argv) {
  return distjax::examples::run_main("tensor_parallel_gpt", [&] {
    return distjax::examples::run_gpt_example(
        argc, argv, "tensor_parallel_gpt",
        {.data = 2, .model = 4, .layout = "megatron", .fsdp = 0});
  });
}
