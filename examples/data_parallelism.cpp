// The classifier on Fashion-MNIST over a ("data"=8) mesh with its parameters fully
// sharded (FSDP, --zero 3, the default), plain data parallel (--zero 0), ZeRO-1 or ZeRO-2;
// prints the sharding of every parameter and the bytes each device holds. The model is
// "classifier" (src/distjax/app/classifiers.cpp), trained by app::train.
//
//   ./build/data_parallelism [--zero 0|1|2|3 --devices 8 --steps 300]
#include "example_main.hpp"

int main(int argc, char** argv) {
  int zero = 3;
  return distjax::examples::example_main(
      argc, argv,
      {.name = "data_parallelism",
       .about = "the MLP classifier on Fashion-MNIST, data parallel with ZeRO / FSDP",
       .flags = {{"devices", "distributed.world_size",
                  "devices along \"data\" (threads; under mpirun the number of processes)"},
                 {"steps", "run.steps", "optimizer steps"},
                 {"batch-size", "run.batch_size", "global batch (split over devices)"},
                 {"min-weight-size", "parallelism.fsdp.min_weight_size",
                  "FSDP: parameters with fewer elements stay replicated"},
                 {"log-every", "run.log_every", "steps between progress lines"},
                 {"data", "data.dir", "directory of the Fashion-MNIST IDX files"}},
       .more = [&](CLI::App& cli) {
         cli.add_option("--zero", zero, "0 plain data parallelism, 1 or 2 ZeRO, 3 FSDP")
             ->check(CLI::Range(0, 3));
       },
       .adjust = [&](distjax::config::TrainConfig& c) {
         c.parallelism.shard = static_cast<distjax::config::Shard>(zero);
       },
       .options = [] { return distjax::app::TrainOptions{.show_sharding = true}; }});
}
