// Mixture-of-Experts benchmarks (the MoE GPT of configs/gpt_moe.toml: L4 C128 H4 T64 V256,
// batch 16, 8 experts of hidden 256, top-2, dropless, AdamW):
//
//   grouped_gemm_vs_gemm_loop            the grouped product (tensor::grouped_matmul, one
//                                        kernel call over the experts' ragged groups of rows)
//                                        against one oneDNN matmul per expert on the same rows
//                                        (slices, tensor::matmul, concat), forward and
//                                        backward, 2048 tokens routed top-2 over 8 experts,
//                                        C 256, H 1024
//   moe_vs_dense_same_active_params_step_ratio
//                                        a training step of the MoE GPT over one of the dense
//                                        GPT whose MLP (hidden 512) has the parameters a token
//                                        uses of the MoE layer (2 experts of hidden 256; the
//                                        router's C x E beside), one device
//   moe_gpt_train_tokens_per_s_vs_pytorch
//                                        the MoE GPT's training tokens/s against the same model
//                                        in PyTorch, eager (bench/reference/torch_moe.py, run
//                                        by this program: same batch, experts, top-k, dropless
//                                        routing, losses and optimizer)
//   moe_ep4_all_to_all_share_of_step     4 simulated devices, experts over an "expert" axis of
//                                        4, the link model slowed (latency 20 us, 0.25 GB/s,
//                                        --ep-gbps): the time in the exchange's all_to_alls
//                                        over the step
//   moe_ep4_all_to_all_hidden_fraction   the share of that exchange's link cost (step on the
//                                        slowed link minus step on a free one) that the
//                                        exchange in 4 chunks (--ep-chunks) overlapped with
//                                        the experts' products does not pay
//
// Usage: bench_moe [--seconds S] [--rounds R] [--part all|grouped|step|ep] [--python P]
//                  [--ep-gbps G] [--ep-chunks K]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "bench_util.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/moe.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/train/train_step.hpp"
#include "step_timer.hpp"

using namespace distjax;
using namespace distjax::bench;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  double seconds = 4.0;
  int rounds = 3;
  std::string part = "all";
  std::string python = "/usr/bin/python3";
  double ep_gbps = 0.25;     // the slowed link of the expert-parallel lines
  std::int64_t ep_chunks = 4;  // the chunked exchange's chunks
};

Tensor random(std::uint64_t seed, const Shape& shape, float scale = 1.f) {
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  random_uniform(Key::from_seed(seed), v.data(), static_cast<std::int64_t>(v.size()), -scale,
                 scale);
  return Tensor::from_vector(v, shape);
}

// ------------------------------------------------------------------ grouped products

void bench_grouped(const Options& o, Writer& out) {
  const std::int64_t tokens = 2048, e = 8, k = 2, c = 256, h = 1024;
  // Rows of a real routing: a random router's top-2, so the groups are ragged.
  const Tensor probs = tensor::softmax(tensor::matmul(random(1, {tokens, c}), random(2, {c, e})));
  const tensor::DispatchPlan plan = tensor::dispatch_plan(tensor::top_k_indices(probs, k), e);
  const std::vector<std::int64_t> offsets = plan.offsets();
  const Tensor x0 = random(3, {plan.rows(), c}), w0 = random(4, {e, c, h}, 0.05f);
  const Tensor cot = random(5, {plan.rows(), h});
  std::vector<Tensor> w_parts;
  for (std::int64_t g = 0; g < e; ++g)
    w_parts.push_back(tensor::reshape(tensor::slice(w0, 0, g, g + 1), {c, h}).clone());
  auto step = [&](bool grouped) {
    TensorTree p;
    p.set("x", x0);
    if (grouped) p.set("w", w0);
    else
      for (std::int64_t g = 0; g < e; ++g) p.set("w" + std::to_string(g), w_parts[g]);
    autodiff::value_and_grad([&](const TensorTree& t) {
      Tensor y;
      if (grouped) {
        y = tensor::grouped_matmul(t.at("x"), t.at("w"), offsets);
      } else {
        std::vector<Tensor> parts;
        for (std::int64_t g = 0; g < e; ++g)
          parts.push_back(tensor::matmul(tensor::slice(t.at("x"), 0, offsets[g], offsets[g + 1]),
                                         t.at("w" + std::to_string(g))));
        y = tensor::concat(parts, 0);
      }
      return tensor::sum(tensor::mul(y, cot));
    })(p);
  };
  std::vector<double> grouped, loop;
  for (int r = 0; r < o.rounds; ++r) {
    const double each = o.seconds / (2.0 * o.rounds);
    for (double t : time_calls([&] { step(true); }, 2, 1, each, 3)) grouped.push_back(t);
    for (double t : time_calls([&] { step(false); }, 2, 1, each, 3)) loop.push_back(t);
  }
  const double tg = median(grouped), tl = median(loop);
  json j = line("grouped_gemm_vs_gemm_loop", tl / tg, "ratio");
  j["better"] = "higher";
  j["target"] = 1.0;
  j["meets_target"] = tl / tg >= 1.0;
  j["baseline"] = "one oneDNN matmul per expert on the same rows (slices, concat)";
  j["baseline_value"] = tl;
  j["grouped_s"] = tg;
  j["loop_s"] = tl;
  j["what"] = "forward and backward, 2048 tokens top-2 over 8 experts (" +
              std::to_string(plan.rows()) + " rows), C 256, H 1024, f32";
  std::vector<std::int64_t> sizes(plan.counts.begin(), plan.counts.end());
  j["group_rows"] = sizes;
  out.write(j);
}

// ------------------------------------------------------------------ the MoE GPT

// The MoE GPT (its expert exchange in `chunks`), or with moe false the dense one.
models::TransformerConfig moe_gpt(bool moe, std::int64_t chunks = 1) {
  models::TransformerConfig c{.vocab = 256, .d_model = 128, .num_layers = 4, .num_heads = 4,
                              .max_len = 64};
  if (moe) {
    c.moe_every = 1;
    c.moe = {.num_experts = 8, .top_k = 2, .hidden = 256, .aux_loss_coef = 0.01,
             .z_loss_coef = 0.001, .exchange_chunks = chunks};
  }
  return c;
}

struct Variant {
  std::string name;
  bool moe = true;
  std::int64_t chunks = 1;  // the expert exchange's
};

// One shard_map call of `devices` devices ("expert" axis when > 1) running `variants` of the
// MoE or dense GPT, each device on its own batch share of 16 x 64 tokens.
void gpt_round(const std::vector<Variant>& variants, int devices, const comm::LinkModel& link,
               Round& round) {
  const train::Batch batch = token_batch(16 / devices, 64, 256);
  std::vector<std::unique_ptr<models::Transformer>> models;
  for (const Variant& v : variants)
    models.push_back(std::make_unique<models::Transformer>(moe_gpt(v.moe, v.chunks)));
  spmd::ShardMapOptions so;
  so.intra_op_threads = devices == 1 ? 0 : 1;
  so.link = link;
  so.timeout = std::chrono::milliseconds(600000);
  const mesh::Mesh mesh = devices == 1 ? mesh::Mesh({1}, {"data"})
                                       : mesh::Mesh({devices}, {"expert"});
  spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        const mesh::Axes axis = mesh.axis_names().front();
        std::vector<std::unique_ptr<nn::ParamSpecs>> specs;
        std::vector<std::unique_ptr<parallel::DataParallel>> dps;
        std::vector<train::TrainState> states;
        std::vector<DeviceStep> steps;
        states.reserve(models.size());
        for (const auto& gpt : models) {
          specs.push_back(std::make_unique<nn::ParamSpecs>());
          dps.push_back(std::make_unique<parallel::DataParallel>(
              ctx, axis, specs.back().get(),
              parallel::DataParallelOptions{.expert = devices > 1 ? axis : mesh::Axes()}));
          states.push_back(train::TrainState::create(
              gpt->init(Key::from_seed(0), specs.back().get(), &ctx), bench_adamw(),
              Key::from_seed(2), *dps.back()));
        }
        for (std::size_t i = 0; i < models.size(); ++i) {
          const models::Transformer* gpt = models[i].get();
          train::TrainState* state = &states[i];
          parallel::DataParallel* dp = dps[i].get();
          steps.push_back(
              {[&ctx, gpt, state, dp, &batch] {
                 const train::LossFn fn = [&](const TensorTree& p, const train::Batch& b, Key key) {
                   const nn::Scope s = nn::Scope::apply(&p, true, key).on(ctx);
                   return std::make_pair(gpt->loss(s, b.inputs, b.labels), train::Metrics{});
                 };
                 return static_cast<float>(
                     train::train_step(*state, batch, fn, bench_adamw(), {.strategy = dp})
                         .mean("loss"));
               },
               state->params.num_elements()});
        }
        round.run(ctx, steps);
        return std::vector<Tensor>{};
      },
      {}, {}, so)(std::vector<Tensor>{});
}

// tokens/s of bench/reference/torch_moe.py, run now; 0 when it could not run.
double torch_tokens_per_s(const Options& o, json& info) {
  info = reference_result(o.python + " " + DISTJAX_SOURCE_DIR +
                              "/bench/reference/torch_moe.py --seconds " +
                              std::to_string(o.seconds),
                          "tokens_per_s");
  return info.contains("error") ? 0.0 : info["tokens_per_s"].get<double>();
}

void bench_step(const Options& o, Writer& out) {
  const std::vector<RoundSpec> specs = {
      {{"moe", "dense"},
       [&](Round& r) { gpt_round({{"moe", true}, {"dense", false}}, 1, {}, r); }}};
  const auto m = run_alternating(specs, o.rounds, o.seconds, "", "bench_moe");
  const double tm = median(m.at("moe").step_times), td = median(m.at("dense").step_times);
  const double tokens = 16.0 * 64.0;
  json j = line("moe_vs_dense_same_active_params_step_ratio", tm / td, "ratio");
  j["better"] = "lower";
  j["target"] = 1.3;
  j["meets_target"] = tm / td <= 1.3;
  j["baseline"] = "the dense GPT with the active parameters (MLP hidden 512), one device";
  j["baseline_value"] = td;
  j["moe_step_s"] = tm;
  j["dense_step_s"] = td;
  j["moe_params"] = m.at("moe").params_per_device;
  j["dense_params"] = m.at("dense").params_per_device;
  out.write(j);

  json info;
  const double torch = torch_tokens_per_s(o, info);
  json t = line("moe_gpt_train_tokens_per_s_vs_pytorch", torch > 0 ? (tokens / tm) / torch : 0.0,
                "ratio");
  if (torch <= 0) t["value"] = nullptr;
  t["better"] = "higher";
  t["target"] = 1.5;
  t["meets_target"] = torch > 0 && (tokens / tm) / torch >= 1.5;
  t["baseline"] = "PyTorch eager, bench/reference/torch_moe.py, run in the same process tree";
  t["baseline_value"] = torch;
  t["distjax_tokens_per_s"] = tokens / tm;
  t["pytorch"] = info;
  out.write(t);
}

// Seconds per step in the exchange's all_to_alls, the counts' all_gathers and bytes sent.
struct ExchangeTimes {
  double all_to_all = 0, gather = 0, bytes = 0;
};
ExchangeTimes exchange_times(const Measured& m) {
  ExchangeTimes t;
  for (const CommPerStep& c : m.comm) {
    t.all_to_all += c.seconds_by_kind[static_cast<int>(comm::OpKind::AllToAll)];
    t.gather += c.seconds_by_kind[static_cast<int>(comm::OpKind::AllGather)];
    t.bytes += c.bytes_by_kind[static_cast<int>(comm::OpKind::AllToAll)];
  }
  const double rounds = static_cast<double>(std::max<std::size_t>(m.comm.size(), 1));
  t.all_to_all /= rounds;
  t.gather /= rounds;
  t.bytes /= rounds;
  return t;
}

// The expert exchange of 4 devices in one piece and in o.ep_chunks chunks overlapped with
// the experts' products, each on a slowed link and on a free one (the link model's cost is
// the difference).
void bench_ep(const Options& o, Writer& out) {
  const comm::LinkModel slow{.latency_us = 20, .bandwidth_gbps = o.ep_gbps};
  const std::vector<Variant> variants = {{"ep4", true, 1}, {"ep4_chunked", true, o.ep_chunks}};
  auto named = [&](const std::string& suffix) {
    std::vector<std::string> names;
    for (const Variant& v : variants) names.push_back(v.name + suffix);
    return names;
  };
  auto renamed = [&](const std::string& suffix) {
    std::vector<Variant> vs = variants;
    for (Variant& v : vs) v.name += suffix;
    return vs;
  };
  const std::vector<RoundSpec> specs = {
      {named(""), [&](Round& r) { gpt_round(renamed(""), 4, slow, r); }},
      {named("_free"), [&](Round& r) { gpt_round(renamed("_free"), 4, {}, r); }}};
  const auto m = run_alternating(specs, o.rounds, o.seconds, "", "bench_moe");
  const double t = median(m.at("ep4").step_times), t_free = median(m.at("ep4_free").step_times);
  const double tc = median(m.at("ep4_chunked").step_times);
  const double tc_free = median(m.at("ep4_chunked_free").step_times);
  const ExchangeTimes one = exchange_times(m.at("ep4")), chunked = exchange_times(m.at("ep4_chunked"));
  json j = line("moe_ep4_all_to_all_share_of_step", one.all_to_all / t, "fraction");
  j["better"] = "lower";
  j["step_s"] = t;
  j["all_to_all_s_per_step"] = one.all_to_all;
  j["counts_all_gather_s_per_step"] = one.gather;
  j["all_to_all_bytes_sent_per_step"] = one.bytes;
  const std::string link = "latency 20 us, " + std::to_string(o.ep_gbps) + " GB/s (comm::LinkModel)";
  j["link"] = link;
  j["mesh"] = "expert=4, one thread per device, batch 4 x 64 tokens per device";
  j["exchange"] = "one all_to_all each way per layer (exchange_chunks = 1), none of it overlapped";
  j["link_cost_s_per_step"] = t - t_free;
  j["link_cost_share_of_step"] = (t - t_free) / t;
  j["note"] =
      "value: the calls' own seconds as the counters take them (to the exchange's completion "
      "on the worker, without the link model's delay in the wait); link_cost: the step on the "
      "slowed link minus the step on a free one";
  out.write(j);
  // The link's cost of a step: slowed minus free link. Hidden: the share of the one-piece
  // exchange's cost that the chunked exchange does not pay.
  const double cost = t - t_free, cost_chunked = tc - tc_free;
  const double hidden = cost > 0 ? 1.0 - cost_chunked / cost : 0.0;
  json h = line("moe_ep4_all_to_all_hidden_fraction", hidden, "fraction");
  h["better"] = "higher";
  h["target"] = 0.5;
  h["meets_target"] = hidden >= 0.5;
  h["baseline"] = "the same step with the exchange in one piece (exchange_chunks = 1)";
  h["method"] =
      "1 - (T_chunked(slow link) - T_chunked(free link)) / (T_one(slow link) - T_one(free link)), "
      "medians of alternating rounds";
  h["overlap"] =
      "exchange_chunks = " + std::to_string(o.ep_chunks) +
      ": every chunk's rows start travelling at once; the experts run on chunk c while chunks "
      "c + 1.. arrive, and chunk c's outputs travel back while they run on chunk c + 1; the "
      "backward pass mirrors it";
  h["step_s_one_piece_slow"] = t;
  h["step_s_one_piece_free"] = t_free;
  h["step_s_chunked_slow"] = tc;
  h["step_s_chunked_free"] = tc_free;
  h["all_to_all_s_per_step_chunked"] = chunked.all_to_all;
  h["chunked_vs_one_piece_step_slow_link"] = t / tc;
  h["chunked_vs_one_piece_step_free_link"] = t_free / tc_free;
  h["link"] = link;
  out.write(h);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"DistJax Mixture-of-Experts benchmarks"};
  app.add_option("--seconds", o.seconds, "timed seconds per variant, over all rounds");
  app.add_option("--rounds", o.rounds, "alternating rounds");
  app.add_option("--part", o.part, "all, grouped, step or ep");
  app.add_option("--python", o.python, "the interpreter of the PyTorch reference");
  app.add_option("--ep-gbps", o.ep_gbps, "the slowed link of the expert-parallel lines, GB/s");
  app.add_option("--ep-chunks", o.ep_chunks, "the chunked exchange's chunks");
  CLI11_PARSE(app, argc, argv);
  Writer out;
  if (o.part == "all" || o.part == "grouped") bench_grouped(o, out);
  if (o.part == "all" || o.part == "step") bench_step(o, out);
  if (o.part == "all" || o.part == "ep") bench_ep(o, out);
  return 0;
}
