// Global-view benchmark (issue 11): the GPT training step written once in the global view
// (models/global_transformer.hpp, Megatron rules by path) against the hand-written
// tensor-parallel step of models::Transformer (TPLayout::Megatron) on the same mesh,
// shardings, batch and optimizer, measured alternately step by step in one shard_map.
//
//   global_view_gpt_vs_shard_map_tp   tokens/s of the global-view step / tokens/s of the
//                                     hand-written step (goal >= 0.9)
//
//   bench_global_view [--seconds S] [--rounds R] [--only NAME]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.hpp"
#include "distjax/global/program.hpp"
#include "distjax/models/global_transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/train_step.hpp"
#include "step_timer.hpp"

using namespace distjax;
using namespace distjax::bench;
using parallel::TPLayout;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  double seconds = 4.0;
  int rounds = 3;
  std::string only;
};

constexpr int kDevices = 2;
constexpr std::int64_t kBatch = 16;

void run_round(Round& round) {
  const optim::AdamW& opt = bench_adamw();
  const models::TransformerConfig plain = bench_gpt({});
  const models::Transformer hand(bench_gpt({.layout = TPLayout::Megatron}));
  const train::Batch batch = token_batch(kBatch, plain.max_len, plain.vocab);
  const TensorTree init = models::Transformer(plain).init(Key::from_seed(0));
  const parallel::ShardingRules rules = models::transformer_megatron_rules("model");
  spmd::ShardMapOptions so;
  so.intra_op_threads = 1;
  so.timeout = std::chrono::milliseconds(120000);
  auto body = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    // Hand-written Megatron step.
    train::Strategy single;
    const train::TrainStepOptions step_options{.strategy = &single};
    train::TrainState hs = train::TrainState::create(hand.init(Key::from_seed(0), nullptr, &ctx),
                                                     opt, Key::from_seed(2));
    const train::LossFn hand_loss = [&](const TensorTree& p, const train::Batch& b, Key k) {
      return std::make_pair(hand.loss(nn::Scope::apply(&p, true, k).on(ctx), b.inputs, b.labels),
                            train::Metrics{});
    };
    // Global view: the same parameters cut by the rules, the same optimizer.
    global::GlobalTree params;
    for (const auto& [path, t] : init)
      params.emplace(path, global::GlobalArray::from_host(ctx, t, {rules.spec_for(path)}));
    TensorTree locals = global::locals_of(params), state = opt.init(locals);
    const global::GlobalArray x = global::GlobalArray::from_host(ctx, batch.inputs, {mesh::P()});
    const global::GlobalArray y = global::GlobalArray::from_host(ctx, batch.labels, {mesh::P()});
    std::int64_t gstep = 0;
    const std::vector<DeviceStep> steps{
        {[&] {
           return static_cast<float>(
               train::train_step(hs, batch, hand_loss, opt, step_options).mean("loss"));
         },
         hs.params.num_elements()},
        {[&] {
           auto [loss, grads] = global::value_and_grad(
               [&](const global::GlobalTree& p) {
                 return models::global_transformer_loss(plain, p, x, y);
               },
               params);
           opt.update(locals, global::locals_of(grads), state, gstep++);
           return loss.local().item<float>();
         },
         locals.num_elements()}};
    round.run(ctx, steps);
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh::Mesh({kDevices}, {"model"}), body, {}, {}, so)(std::vector<Tensor>{});
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App cli{"bench_global_view: the global view against hand-written SPMD"};
  cli.add_option("--seconds", o.seconds, "time budget per measurement");
  cli.add_option("--rounds", o.rounds, "rounds per measurement")->check(CLI::PositiveNumber);
  cli.add_option("--only", o.only, "run only the measurement of this name");
  CLI11_PARSE(cli, argc, argv);
  const json load_before = load_json();
  const OtherLoad other;
  const auto m =
      bench::run_alternating({{{"shard_map_tp", "global_view"}, [](Round& r) { run_round(r); }}},
                             o.rounds, o.seconds, o.only, "bench_global_view");
  if (!o.only.empty()) return 0;
  const double tok = static_cast<double>(kBatch) * 128.0;
  const Measured &mh = m.at("shard_map_tp"), &mg = m.at("global_view");
  const double th = median(mh.step_times), tg = median(mg.step_times);
  Writer out;
  json j = line("global_view_gpt_vs_shard_map_tp", th / tg, "ratio");
  j["better"] = "higher";
  j["target"] = 0.9;
  j["meets_target"] = th / tg >= 0.9;
  j["tokens_per_s_global_view"] = tok / tg;
  j["tokens_per_s_shard_map_tp"] = tok / th;
  j["step_time_median_s_global_view"] = tg;
  j["step_time_median_s_shard_map_tp"] = th;
  j["steps"] = {mg.step_times.size(), mh.step_times.size()};
  j["comm_bytes_sent_per_step_per_device_global_view"] = mean_bytes(mg);
  j["comm_bytes_sent_per_step_per_device_shard_map_tp"] = mean_bytes(mh);
  j["all_reduce_calls_per_step_global_view"] = mean_calls(mg, comm::OpKind::AllReduce);
  j["all_reduce_calls_per_step_shard_map_tp"] = mean_calls(mh, comm::OpKind::AllReduce);
  j["loss_final"] = {mg.loss, mh.loss};
  j["how"] =
      "GPT L4 H4 d256 T128 V256 B16 on (model=2), 1 thread per device, AdamW lr 3e-4 wd 0.1: "
      "the global-view program with Megatron rules by path vs models::Transformer with "
      "TPLayout::Megatron through train::train_step; alternating steps in one shard_map, "
      "medians over all rounds";
  j["rounds"] = o.rounds;
  j["loadavg_before"] = load_before;
  j["loadavg_after"] = load_json();
  j["other_processes_cpu_cores"] = other.cores();
  out.write(j);
  return 0;
}
