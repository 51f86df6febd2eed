// The pipeline-parallel classifier on Fashion-MNIST over a (data=2, pipe=4) mesh: an input
// Dense, residual MLP blocks cut into stages and a head, micro-batches run by a checked
// schedule; prints the measured bubble of the last step against the theory, and with
// --show-schedule the schedule and the measured per-stage timeline. The model is
// "pp_classifier" (src/distjax/app/classifiers.cpp), trained by app::train.
//
//   ./build/pipeline_parallelism [--schedule gpipe|1f1b|interleaved|zbh1|interleaved_zb]
//                                [--microbatches 8] [--show-schedule]
#include "example_main.hpp"

int main(int argc, char** argv) {
  int n_data = 0, n_pipe = 0;  // 0: as the config says
  bool show = false;
  return distjax::examples::example_main(
      argc, argv,
      {.name = "pipeline_parallelism",
       .about = "the pipeline-parallel MLP classifier on Fashion-MNIST",
       .flags = {{"schedule", "parallelism.schedule", "gpipe, 1f1b, interleaved, zbh1 or interleaved_zb"},
                 {"microbatches", "parallelism.microbatches", "micro-batches per step (m)"},
                 {"virtual-stages", "parallelism.virtual_stages",
                  "chunks per stage (interleaved schedules; 2 by default there)"},
                 {"layers", "model.layers", "residual MLP blocks, cut over the stages"},
                 {"hidden", "model.hidden", "width of the blocks"},
                 {"steps", "run.steps", "optimizer steps"},
                 {"batch-size", "run.batch_size", "global batch (split over \"data\")"},
                 {"log-every", "run.log_every", "steps between progress lines"},
                 {"data-dir", "data.dir", "directory of the Fashion-MNIST IDX files"}},
       .more = [&](CLI::App& cli) {
         cli.add_option("--data", n_data, "devices along \"data\" (data parallel)");
         cli.add_option("--pipe", n_pipe, "devices along \"pipe\" (pipeline stages)");
         cli.add_flag("--show-schedule", show,
                      "print the schedule and the measured timeline of the last step");
       },
       .adjust = [&](distjax::config::TrainConfig& c) {
         auto& d = c.distributed;
         const int pipe = n_pipe > 0 ? n_pipe : d.pipeline_parallel_size;
         const int data = n_data > 0 ? n_data : d.world_size / d.pipeline_parallel_size;
         d.pipeline_parallel_size = pipe;
         d.world_size = data * pipe;
         const std::string& s = c.parallelism.schedule;
         if ((s == "interleaved" || s == "interleaved_zb") && c.parallelism.virtual_stages == 1)
           c.parallelism.virtual_stages = 2;
       },
       .options = [&] { return distjax::app::TrainOptions{.show_schedule = show}; }});
}
