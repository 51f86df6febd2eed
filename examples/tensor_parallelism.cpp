// The toolkit's tensor_parallelism example: the TP classifier (3 blocks, hidden 512) on
// Fashion-MNIST on a
// ("data"=2, "model"=4) mesh of 8 simulated devices (synchronous TPDense gathers and
// reduce-scatters). Prints the mesh and "[TP] Step i: Loss = ..., Accuracy = ..." lines, then the
// test accuracy.
//
//   ./build/tensor_parallelism [--data 2 --model 4 --steps 300]
//   mpirun -np 8 ./build/tensor_parallelism          (one process per device)
#include "tensor_parallelism.hpp"

int main(int argc, char** argv) {
  return distjax::examples::run_main("tensor_parallelism", [&] {
    return distjax::examples::run_tensor_parallelism(argc, argv, "tensor_parallelism",
                                                     /*async_rings=*/false);
  });
}
