// A program of your own (docs/app.md): a GPT on the fortunes corpus over data x model x
// pipe, its parameters fully sharded over "data", with the application's pieces.
#include "distjax/distjax.hpp"

using namespace distjax;

int main() {
  config::TrainConfig c = app::builtin_config("gpt_3d");  // [model], a (2, 2, 2) mesh, 1F1B
  c.run.steps = 20;
  c.run.out_dir = "runs/my_program";
  c.run.overwrite = true;
  c.parallelism.shard = config::Shard::Parameters;  // FSDP over "data" inside each stage
  c = app::prepare_program(c);         // validated and resolved, as `distjax train` does
  const mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  const app::TextData text = app::load_text(c);  // data.format, data.seq_len, validation
  const models::Transformer gpt(app::transformer_config(c, app::transformer_tp(c, mesh)));
  const models::TransformerPipeline stages(gpt.config());
  const optim::AdamW adamw = app::make_adamw(c, c.run.steps);
  auto device = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    app::Composed parallel(c, &ctx, app::transformer_spec(gpt, &stages));
    train::TrainState state = parallel.create_state(adamw, Key::from_seed(0), Key::from_seed(1));
    auto mine = [&](const train::Batch& b) {  // this replica's rows of a global batch
      return app::replica_slice(b, parallel.replica(), parallel.data_parallel_size());
    };
    std::vector<train::Batch> eval;
    for (const train::Batch& b : text.validation()) eval.push_back(mine(b));
    auto batch = [&](std::int64_t step) {
      return mine(text.sample(c.run.batch_size, c.data.seq_len, Key::from_seed(2).fold_in(step)));
    };
    app::run_loop({.config = &c, .ctx = &ctx, .composed = &parallel, .optimizer = &adamw,
                   .state = &state, .total_steps = c.run.steps, .log_every = 5,
                   .items_per_example = double(c.data.seq_len), .items_name = "tokens",
                   .model_parameters = gpt.num_params(), .batch = batch, .eval_batches = eval});
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh, device, {}, {}, {.backend = c.distributed.comm_backend()})(std::vector<Tensor>{});
  return 0;
}
