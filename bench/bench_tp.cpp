// Tensor-parallel GPT benchmarks (issue 7): the training step of models::Transformer run
// with tensor parallelism over simulated devices (threads backend, one shard_map call per
// configuration that does its warm-up and timed steps inside), timed on device 0 between
// barriers so that a step is the slowest device's.
//
//   tp_async_comm_hidden_fraction   4 devices, slow link (comm::LinkModel): how much of the
//                                   synchronous layout's communication time the ppermute
//                                   rings hide: (T_sync - T_async) / T_comm(sync)
//   tp_gpt_2dev_vs_1dev_speedup     Megatron TP over 2 devices with one thread each vs one
//                                   device with one thread, same global batch (tokens/s)
//   distjax_gpt_tp2_train_tokens_per_s
//                                   the 2-device Megatron step above, paired by
//                                   bench/summarize.py with bench/reference/jax_tp_gpt.py
//                                   into tp_gpt_vs_jax_shard_map
//
// Configurations are measured alternately in rounds (load from other processes hits all of
// them alike); each figure is the median over the steps of all rounds. bench/README.md
// says what each line measures and why.
//
// Usage: bench_tp [--seconds S] [--rounds R] [--part all|async|scaling]
//                 [--latency-us U] [--bandwidth-gbps G] [--async-batch B] [--async-layers L]
//                 [--async-d C]
//   --seconds S  timed seconds per variant, split over the rounds (default 4)
//   --rounds R   alternating rounds (default 3)
//   --only NAME  run only the shard_map whose first variant is NAME (sync_slow_link,
//                sync_free_link, megatron_2dev, single_1dev; for profiling), print its step
//                times to stderr and write no lines
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/comm/comm_stats.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/parallel/strategy.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/train/train_step.hpp"

using namespace distjax;
using namespace distjax::bench;
using parallel::TPLayout;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  double seconds = 4.0;  // timed seconds per configuration, over all rounds
  int rounds = 3;
  std::string part = "all";
  // The async-TP line's link and model (defaults chosen in bench/README.md).
  double latency_us = 20.0;
  double bandwidth_gbps = 1.0;
  std::int64_t async_batch = 16;
  std::int64_t async_layers = 4;
  std::int64_t async_d = 256;
  std::string only;  // run only the configuration of this name (profiling); prints no lines
};

/// The bench GPT of bench_train.cpp and bench/reference/jax_tp_gpt.py.
models::TransformerConfig bench_gpt(models::TransformerTP tp, std::int64_t layers = 4,
                                    std::int64_t d_model = 256) {
  return {.vocab = 256,
          .d_model = d_model,
          .num_layers = layers,
          .num_heads = 4,
          .mlp_ratio = 4,
          .max_len = 128,
          .learned_positions = true,
          .tied_embeddings = true,
          .dropout = 0.f,
          .ln_eps = 1e-5f,
          .tp = tp};
}

train::Batch token_batch(std::int64_t batch, std::int64_t seq, std::int64_t vocab) {
  const Key key = Key::from_seed(1);
  Tensor x = Tensor::empty({batch, seq}, DType::I32), y = Tensor::empty({batch, seq}, DType::I32);
  for (std::int64_t i = 0; i < batch * seq; ++i) {
    const auto bits = key.bits(static_cast<std::uint64_t>(i));
    x.data<std::int32_t>()[i] =
        static_cast<std::int32_t>(bits[0] % static_cast<std::uint32_t>(vocab));
    y.data<std::int32_t>()[i] =
        static_cast<std::int32_t>(bits[1] % static_cast<std::uint32_t>(vocab));
  }
  return {x, y};
}

/// One model layout run in a configuration.
struct Variant {
  std::string name;
  models::TransformerConfig model;
};

/// One shard_map call: the devices, the link, and the variants it runs in alternating
/// steps (so that load from other processes hits them alike, step by step).
struct Config {
  int devices = 1;
  std::int64_t batch = 16;
  comm::LinkModel link{};
  int intra_op_threads = 1;
  std::vector<Variant> variants;
};

/// Communication of one device, per timed step (barriers of the timing excluded).
struct CommPerStep {
  double seconds = 0;       // inside communicator calls, waiting for peers included
  double wait_seconds = 0;  // of which waiting for the other devices to arrive
  double bytes_sent = 0;
};

/// What the timed steps of all rounds of one variant gave.
struct Measured {
  std::vector<double> step_times;  // device 0, between barriers
  std::vector<CommPerStep> comm;   // one entry per round: mean over devices and steps
  float loss = 0.f;
  std::int64_t params_per_device = 0;
};

using Counters = std::array<comm::OpCounters, comm::kNumOpKinds>;

// Adds the counters of `after` - `before` (barriers excluded) to `c`.
void add_comm(CommPerStep& c, const Counters& before, const Counters& after) {
  for (int k = 0; k < comm::kNumOpKinds; ++k) {
    if (static_cast<comm::OpKind>(k) == comm::OpKind::Barrier) continue;
    c.seconds += after[k].seconds - before[k].seconds;
    c.wait_seconds += after[k].wait_seconds - before[k].wait_seconds;
    c.bytes_sent += static_cast<double>(after[k].bytes_sent - before[k].bytes_sent);
  }
}

/// Runs `cfg` for one round: one shard_map call in which every device creates the shards
/// of every variant, runs `warmup` steps of each, then steps of each variant in turn
/// until `seconds` (at least `min_steps` of each).
void run_round(const Config& cfg, double seconds, int warmup, int min_steps,
               std::map<std::string, Measured>& out) {
  const optim::AdamW opt({.learning_rate = optim::constant_schedule(3e-4),
                          .b1 = 0.9,
                          .b2 = 0.95,
                          .eps = 1e-8,
                          .weight_decay = 0.1,
                          .decay_mask = {}});
  const std::size_t nv = cfg.variants.size();
  std::vector<models::Transformer> gpts;
  std::vector<train::Batch> batches;
  for (const Variant& v : cfg.variants) {
    gpts.emplace_back(v.model);
    batches.push_back(token_batch(cfg.batch, v.model.max_len, v.model.vocab));
  }
  std::atomic<bool> go_on{true};
  std::mutex mu;
  std::vector<std::vector<CommPerStep>> per_device(nv);  // [variant][device]
  spmd::ShardMapOptions so;
  so.link = cfg.link;
  so.intra_op_threads = cfg.intra_op_threads;
  so.timeout = std::chrono::milliseconds(120000);
  auto body = [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
    parallel::Strategy single;  // tensor parallelism only: no data axis
    const train::TrainStepOptions step_options{.strategy = &single};
    std::vector<train::TrainState> states;
    std::vector<train::LossFn> loss_fns;
    for (std::size_t v = 0; v < nv; ++v) {
      states.push_back(train::TrainState::create(gpts[v].init(Key::from_seed(0), nullptr, &ctx),
                                                 opt, Key::from_seed(2)));
      const bool tp = cfg.variants[v].model.tp.layout != TPLayout::None;
      loss_fns.push_back(
          [&ctx, &gpt = gpts[v], tp](const TensorTree& p, const train::Batch& b, Key k) {
            nn::Scope s = nn::Scope::apply(&p, /*train=*/true, k);
            if (tp) s = s.on(ctx);
            return std::make_pair(gpt.loss(s, b.inputs, b.labels), train::Metrics{});
          });
    }
    std::vector<float> loss(nv);
    auto step = [&](std::size_t v) {
      loss[v] = static_cast<float>(
          train::train_step(states[v], batches[v], loss_fns[v], opt, step_options).mean("loss"));
    };
    for (std::size_t v = 0; v < nv; ++v)
      for (int i = 0; i < warmup; ++i)
        step(v);
    const auto start = Clock::now();
    int steps = 0;
    std::vector<std::vector<double>> times(nv);
    std::vector<CommPerStep> comm(nv);
    while (true) {
      for (std::size_t v = 0; v < nv; ++v) {
        ctx.world().barrier();
        const Counters before = ctx.comm_stats().by_kind;
        const auto t0 = Clock::now();
        step(v);
        add_comm(comm[v], before, ctx.comm_stats().by_kind);
        if (ctx.device() == 0 && v + 1 == nv)
          go_on = steps + 1 < min_steps || seconds_since(start) < seconds;
        // Every device has finished its step (and device 0 has decided) after this barrier.
        ctx.world().barrier();
        times[v].push_back(seconds_since(t0));
      }
      ++steps;
      if (!go_on) break;
    }
    std::lock_guard lk(mu);
    for (std::size_t v = 0; v < nv; ++v) {
      CommPerStep c = comm[v];
      c.seconds /= steps;
      c.wait_seconds /= steps;
      c.bytes_sent /= steps;
      per_device[v].push_back(c);
      if (ctx.device() == 0) {
        Measured& m = out[cfg.variants[v].name];
        m.step_times.insert(m.step_times.end(), times[v].begin(), times[v].end());
        m.loss = loss[v];
        m.params_per_device = states[v].params.num_elements();
      }
    }
    return std::vector<Tensor>{};
  };
  spmd::shard_map(mesh::Mesh({cfg.devices}, {"model"}), body, {}, {}, so)(std::vector<Tensor>{});
  for (std::size_t v = 0; v < nv; ++v) {
    CommPerStep mean;
    const double nd = static_cast<double>(per_device[v].size());
    for (const auto& c : per_device[v]) {
      mean.seconds += c.seconds / nd;
      mean.wait_seconds += c.wait_seconds / nd;
      mean.bytes_sent += c.bytes_sent / nd;
    }
    out[cfg.variants[v].name].comm.push_back(mean);
  }
}

/// Every configuration, `rounds` times in alternation; results by variant name.
std::map<std::string, Measured> run_alternating(const std::vector<Config>& cfgs, const Options& o) {
  std::map<std::string, Measured> out;
  for (int r = 0; r < o.rounds; ++r)
    for (const Config& cfg : cfgs) {
      if (!o.only.empty() && cfg.variants.front().name != o.only) continue;
      // The first round also pays for oneDNN's primitive creation.
      run_round(cfg, o.seconds * static_cast<double>(cfg.variants.size()) / o.rounds,
                r == 0 ? 2 : 1, 3, out);
      for (const Variant& v : cfg.variants)
        std::fprintf(stderr, "[bench_tp] round %d %-22s median %.4f s (%zu steps so far)\n", r + 1,
                     v.name.c_str(), median(out[v.name].step_times), out[v.name].step_times.size());
    }
  return out;
}

double mean_comm_seconds(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.seconds / static_cast<double>(m.comm.size());
  return s;
}
double mean_comm_wait(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.wait_seconds / static_cast<double>(m.comm.size());
  return s;
}
double mean_bytes(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.bytes_sent / static_cast<double>(m.comm.size());
  return s;
}

/// CPU time used by other processes while a measurement ran, in cores: the machine's busy
/// time from /proc/stat minus this process's (getrusage), over the wall time. On the 2
/// shared cores here a value near 1 means one core was taken, which a 2-device run feels
/// and a 1-device run does not.
class OtherLoad {
 public:
  OtherLoad() : busy0_(machine_busy_s()), self0_(self_cpu_s()), t0_(Clock::now()) {}
  double cores() const {
    const double wall = seconds_since(t0_);
    if (busy0_ < 0 || wall <= 0) return -1;
    return std::max(0.0, (machine_busy_s() - busy0_ - (self_cpu_s() - self0_)) / wall);
  }

 private:
  static double machine_busy_s() {
    std::FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {};
    const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                                &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    std::fclose(f);
    if (got < 8) return -1;
    // user nice system (idle iowait) irq softirq steal
    const double busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6]);
    return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  static double self_cpu_s() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    auto s = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    return s(r.ru_utime) + s(r.ru_stime);
  }
  double busy0_, self0_;
  Clock::time_point t0_;
};

json load_json() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return json::array();
  return json::array({l[0], l[1], l[2]});
}

// ------------------------------------------------------------------ async TP

void bench_async(const Options& o, Writer& out) {
  const comm::LinkModel slow{.latency_us = o.latency_us, .bandwidth_gbps = o.bandwidth_gbps};
  auto variant = [&](const std::string& name, models::TransformerTP tp) {
    return Variant{.name = name, .model = bench_gpt(tp, o.async_layers, o.async_d)};
  };
  const models::TransformerTP gather{.layout = TPLayout::Gather};
  const models::TransformerTP async{.layout = TPLayout::Async};
  const models::TransformerTP bidi{.layout = TPLayout::Async, .bidirectional = true};
  // The layouts alternate step by step on the same link; the two links alternate by round.
  const std::vector<Config> cfgs = {
      {.devices = 4,
       .batch = o.async_batch,
       .link = slow,
       .intra_op_threads = 1,
       .variants = {variant("sync_slow_link", gather), variant("async_slow_link", async),
                    variant("async_bidi_slow_link", bidi)}},
      {.devices = 4,
       .batch = o.async_batch,
       .link = {},
       .intra_op_threads = 1,
       .variants = {variant("sync_free_link", gather), variant("async_free_link", async)}},
  };
  const json load_before = load_json();
  const OtherLoad other;
  const auto m = run_alternating(cfgs, o);
  if (!o.only.empty()) return;
  const double other_cores = other.cores();
  const Measured &ms = m.at("sync_slow_link"), &ma = m.at("async_slow_link");
  const Measured &msf = m.at("sync_free_link"), &maf = m.at("async_free_link");
  const Measured& mb = m.at("async_bidi_slow_link");
  const double t_sync = median(ms.step_times), t_async = median(ma.step_times);
  const double t_sync_free = median(msf.step_times), t_async_free = median(maf.step_times);
  const double t_bidi = median(mb.step_times);
  // T_comm(sync): what the slow link adds to the synchronous step (same step, zero-cost
  // link). The communicator's own seconds are recorded too but include the time a device
  // waits for the others to arrive, which on 4 threads sharing 2 cores is mostly
  // scheduling, not communication.
  const double t_comm = t_sync - t_sync_free;
  json j = line("tp_async_comm_hidden_fraction", t_comm > 0 ? (t_sync - t_async) / t_comm : 0.0,
                "fraction");
  j["better"] = "higher";
  j["target"] = 0.8;
  j["meets_target"] = j["value"].get<double>() >= 0.8;
  j["t_sync_s"] = t_sync;
  j["t_async_s"] = t_async;
  j["t_comm_sync_s"] = t_comm;
  j["t_comm_method"] =
      "T_sync(slow link) - T_sync(zero-cost link): the time the link adds to the synchronous "
      "step (medians)";
  j["t_sync_free_link_s"] = t_sync_free;
  j["t_async_free_link_s"] = t_async_free;
  j["t_async_bidirectional_s"] = t_bidi;
  j["hidden_fraction_bidirectional"] = t_comm > 0 ? (t_sync - t_bidi) / t_comm : 0.0;
  // The share of the link's cost the async step still pays.
  j["link_cost_async_s"] = t_async - t_async_free;
  j["link_cost_hidden_fraction"] = t_comm > 0 ? 1.0 - (t_async - t_async_free) / t_comm : 0.0;
  j["comm_stats_seconds_per_step_sync"] = mean_comm_seconds(ms);
  j["comm_stats_wait_seconds_per_step_sync"] = mean_comm_wait(ms);
  j["comm_stats_seconds_per_step_async"] = mean_comm_seconds(ma);
  j["comm_stats_wait_seconds_per_step_async"] = mean_comm_wait(ma);
  j["bytes_sent_per_step_per_device_sync"] = mean_bytes(ms);
  j["bytes_sent_per_step_per_device_async"] = mean_bytes(ma);
  j["comm_share_of_sync_step"] = t_sync > 0 ? t_comm / t_sync : 0.0;
  j["step_time_min_s"] = {{"sync", minimum(ms.step_times)},
                          {"async", minimum(ma.step_times)},
                          {"sync_free_link", minimum(msf.step_times)},
                          {"async_free_link", minimum(maf.step_times)},
                          {"async_bidirectional", minimum(mb.step_times)}};
  j["steps"] = {ms.step_times.size(), ma.step_times.size(), msf.step_times.size(),
                maf.step_times.size(), mb.step_times.size()};
  j["link"] = {{"latency_us", o.latency_us}, {"bandwidth_gbps", o.bandwidth_gbps}};
  j["devices"] = 4;
  j["mesh"] = "(model=4)";
  j["threads_per_device"] = 1;
  j["layouts"] =
      "sync = TPLayout::Gather (TPDense all_gather / psum_scatter), async = "
      "TPLayout::Async (TPAsyncDense ppermute rings), bidirectional = Async with "
      "bidirectional rings";
  j["config"] = "GPT L" + std::to_string(o.async_layers) + " H4 d" + std::to_string(o.async_d) +
                " T128 V256 B" + std::to_string(o.async_batch) + ", AdamW";
  j["rounds"] = o.rounds;
  j["loadavg_before"] = load_before;
  j["loadavg_after"] = load_json();
  j["other_processes_cpu_cores"] = other_cores;
  out.write(j);
}

// ------------------------------------------------------------------ scaling and JAX

void bench_scaling(const Options& o, Writer& out) {
  const std::vector<Config> cfgs = {
      {.devices = 2,
       .batch = 16,
       .link = {},
       .intra_op_threads = 1,
       .variants = {{.name = "megatron_2dev", .model = bench_gpt({.layout = TPLayout::Megatron})}}},
      {.devices = 1,
       .batch = 16,
       .link = {},
       .intra_op_threads = 1,
       .variants = {{.name = "single_1dev", .model = bench_gpt({})}}},
  };
  const json load_before = load_json();
  const OtherLoad other;
  const auto m = run_alternating(cfgs, o);
  if (!o.only.empty()) return;
  const double other_cores = other.cores();
  const double tok = 16.0 * 128.0;
  const Measured &m2 = m.at("megatron_2dev"), &m1 = m.at("single_1dev");
  const double t2 = median(m2.step_times), t1 = median(m1.step_times);
  const models::Transformer gpt(bench_gpt({}));
  const double flops = gpt.flops_per_token(128) * tok;

  json d = line("distjax_gpt_tp2_train_tokens_per_s", tok / t2, "tokens/s");
  d["framework"] = "distjax";
  d["model"] = "gpt";
  d["step_time_median_s"] = t2;
  d["step_time_min_s"] = minimum(m2.step_times);
  d["steps"] = m2.step_times.size();
  d["threads"] = 2;  // kernel threads of the run in all (the 2-thread peak is its reference)
  d["threads_per_device"] = 1;
  d["devices"] = 2;
  d["mesh"] = "(model=2)";
  d["layout"] =
      "megatron (qkv, fc1 column-parallel; out, fc2 row-parallel + psum; norms, "
      "embeddings and tied head replicated)";
  d["params"] = gpt.num_params();
  d["params_per_device"] = m2.params_per_device;
  d["flops_per_step"] = flops;
  d["gflops"] = flops / t2 * 1e-9;
  d["comm_bytes_sent_per_step_per_device"] = mean_bytes(m2);
  d["comm_stats_seconds_per_step"] = mean_comm_seconds(m2);
  d["loss_final"] = m2.loss;
  d["config"] = "L4 H4 d256 T128 V256 B16, AdamW lr 3e-4 wd 0.1";
  d["loadavg_before"] = load_before;
  d["other_processes_cpu_cores"] = other_cores;
  if (!std::getenv("DISTJAX_BENCH_ROUND")) d["round"] = 1;
  out.write(d);

  json s = line("tp_gpt_2dev_vs_1dev_speedup", t1 / t2, "x");
  s["better"] = "higher";
  s["ideal"] = 2.0;
  s["target"] = 1.7;
  s["meets_target"] = t1 / t2 >= 1.7;
  s["tokens_per_s_2dev"] = tok / t2;
  s["tokens_per_s_1dev"] = tok / t1;
  s["step_time_median_s_2dev"] = t2;
  s["step_time_median_s_1dev"] = t1;
  s["step_time_min_s_2dev"] = minimum(m2.step_times);
  s["step_time_min_s_1dev"] = minimum(m1.step_times);
  s["speedup_fastest_step"] = minimum(m1.step_times) / minimum(m2.step_times);
  s["steps"] = {m2.step_times.size(), m1.step_times.size()};
  s["comm_stats_seconds_per_step_2dev"] = mean_comm_seconds(m2);
  s["comm_stats_wait_seconds_per_step_2dev"] = mean_comm_wait(m2);
  s["comm_bytes_sent_per_step_per_device"] = mean_bytes(m2);
  s["how"] =
      "Megatron TP over (model=2), intra_op_threads=1 per device, vs the plain model "
      "(TPLayout::None) on 1 device with 1 thread; same global batch 16 x 128 tokens; "
      "medians over the steps of all rounds, measured alternately";
  s["config"] = "L4 H4 d256 T128 V256 B16, AdamW lr 3e-4 wd 0.1";
  s["rounds"] = o.rounds;
  s["loadavg_before"] = load_before;
  s["loadavg_after"] = load_json();
  s["other_processes_cpu_cores"] = other_cores;
  out.write(s);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "--seconds")
      o.seconds = std::atof(next());
    else if (a == "--rounds")
      o.rounds = std::max(1, std::atoi(next()));
    else if (a == "--part")
      o.part = next();
    else if (a == "--latency-us")
      o.latency_us = std::atof(next());
    else if (a == "--bandwidth-gbps")
      o.bandwidth_gbps = std::atof(next());
    else if (a == "--async-batch")
      o.async_batch = std::atoll(next());
    else if (a == "--async-layers")
      o.async_layers = std::atoll(next());
    else if (a == "--only")
      o.only = next();
    else if (a == "--async-d")
      o.async_d = std::atoll(next());
    else {
      std::fprintf(stderr,
                   "usage: bench_tp [--seconds S] [--rounds R] [--part all|async|scaling] "
                   "[--latency-us U] [--bandwidth-gbps G] [--async-batch B] [--async-layers L] "
                   "[--async-d C] [--only NAME]\n");
      return 2;
    }
  }
  Writer out;
  if (o.part == "all" || o.part == "scaling") bench_scaling(o, out);
  if (o.part == "all" || o.part == "async") bench_async(o, out);
  return 0;
}
