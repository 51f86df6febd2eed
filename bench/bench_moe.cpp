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
//                                        4, the link model slowed (latency 20 us, 2 GB/s): the
//                                        time in the exchange's all_to_alls over the step
//   moe_ep4_all_to_all_hidden_fraction   not measured: the exchange does not overlap the
//                                        experts' compute yet (a null line says so)
//
// Usage: bench_moe [--seconds S] [--rounds R] [--part all|grouped|step|ep] [--python P]
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

models::TransformerConfig moe_gpt(bool moe) {
  models::TransformerConfig c{.vocab = 256, .d_model = 128, .num_layers = 4, .num_heads = 4,
                              .max_len = 64};
  if (moe) {
    c.moe_every = 1;
    c.moe = {.num_experts = 8, .top_k = 2, .hidden = 256, .aux_loss_coef = 0.01,
             .z_loss_coef = 0.001};
  }
  return c;
}

// One shard_map call of `devices` devices ("expert" axis when > 1) running `variants` of the
// MoE or dense GPT, each device on its own batch share of 16 x 64 tokens.
void gpt_round(const std::vector<std::pair<std::string, bool>>& variants, int devices,
               const comm::LinkModel& link, Round& round) {
  const train::Batch batch = token_batch(16 / devices, 64, 256);
  std::vector<std::unique_ptr<models::Transformer>> models;
  for (const auto& [name, moe] : variants)
    models.push_back(std::make_unique<models::Transformer>(moe_gpt(moe)));
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
  const std::string cmd = o.python + " " + DISTJAX_SOURCE_DIR +
                          "/bench/reference/torch_moe.py --seconds " +
                          std::to_string(o.seconds) + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return 0;
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe.get()) != nullptr) text += buf;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const std::string l = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (l.empty() || l.front() != '{') continue;
    const json j = json::parse(l, nullptr, false);
    if (j.is_object() && j.contains("tokens_per_s")) {
      info = j;
      return j["tokens_per_s"].get<double>();
    }
  }
  info = {{"error", text.substr(0, 2000)}};
  return 0;
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

void bench_ep(const Options& o, Writer& out) {
  const comm::LinkModel slow{.latency_us = 20, .bandwidth_gbps = 2};
  const std::vector<RoundSpec> specs = {
      {{"ep4"}, [&](Round& r) { gpt_round({{"ep4", true}}, 4, slow, r); }}};
  const auto m = run_alternating(specs, o.rounds, o.seconds, "", "bench_moe");
  const Measured& ep = m.at("ep4");
  const double t = median(ep.step_times);
  double a2a = 0, gather = 0, bytes = 0;
  for (const CommPerStep& c : ep.comm) {
    a2a += c.seconds_by_kind[static_cast<int>(comm::OpKind::AllToAll)];
    gather += c.seconds_by_kind[static_cast<int>(comm::OpKind::AllGather)];
    bytes += c.bytes_by_kind[static_cast<int>(comm::OpKind::AllToAll)];
  }
  const double rounds = static_cast<double>(std::max<std::size_t>(ep.comm.size(), 1));
  json j = line("moe_ep4_all_to_all_share_of_step", a2a / rounds / t, "fraction");
  j["better"] = "lower";
  j["step_s"] = t;
  j["all_to_all_s_per_step"] = a2a / rounds;
  j["counts_all_gather_s_per_step"] = gather / rounds;
  j["all_to_all_bytes_sent_per_step"] = bytes / rounds;
  j["link"] = "latency 20 us, 2 GB/s (comm::LinkModel)";
  j["mesh"] = "expert=4, one thread per device, batch 4 x 64 tokens per device";
  out.write(j);
  json h = line("moe_ep4_all_to_all_hidden_fraction", 0.0, "fraction");
  h["value"] = nullptr;
  h["target"] = 0.5;
  h["reason"] =
      "not measured: the exchange runs before and after the experts' products, none of it "
      "overlapped yet (the share of the step above is all exposed)";
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
  CLI11_PARSE(app, argc, argv);
  Writer out;
  if (o.part == "all" || o.part == "grouped") bench_grouped(o, out);
  if (o.part == "all" || o.part == "step") bench_step(o, out);
  if (o.part == "all" || o.part == "ep") bench_ep(o, out);
  return 0;
}
