// The toolkit's tensor_parallelism_async example: the TP classifier (3 blocks, hidden 512) on
// Fashion-MNIST on a
// ("data"=2, "model"=4) mesh of 8 simulated devices, its gathers and reduce-scatters run as
// ppermute rings overlapped with the matmuls (TPAsyncDense; --bidirectional 1 for rings both ways).
// Prints the mesh and "[TP] Step i: Loss = ..., Accuracy = ..." lines, then the test
// accuracy.
//
//   ./build/tensor_parallelism_async [--data 2 --model 4 --steps 300]
//   mpirun -np 8 ./build/tensor_parallelism_async          (one process per device)
#include "tensor_parallelism.hpp"

int main(int argc, char** argv) {
  return distjax::examples::run_main("tensor_parallelism_async", [&] {
    return distjax::examples::run_tensor_parallelism(argc, argv, "tensor_parallelism_async",
                                                     /*async_rings=*/true);
  });
}
