// The harness of the benchmarks that time training steps on simulated devices (bench_tp,
// bench_dp): the bench GPT and its batch, one shard_map call per configuration in which
// every device runs warm-up steps of each variant and then the variants' steps in turn,
// each timed on device 0 between barriers (a step is the slowest device's), with the
// communicator's counters per step; rounds that alternate the configurations; the load
// other processes put on the machine while it ran.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/comm/comm_stats.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/train/batch.hpp"

namespace distjax::bench {

/// The bench GPT of bench_train.cpp and bench/reference/*.py: L4 H4 d256 T128 V256,
/// learned positions, tied embeddings (3,257,856 parameters at the defaults).
inline models::TransformerConfig bench_gpt(models::TransformerTP tp = {}, std::int64_t layers = 4,
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

/// The bench optimizer: AdamW lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every
/// leaf.
inline const optim::AdamW& bench_adamw() {
  static const optim::AdamW opt({.learning_rate = optim::constant_schedule(3e-4),
                                 .b1 = 0.9,
                                 .b2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .decay_mask = {}});
  return opt;
}

/// A fixed batch of random tokens (batch, seq) with random labels.
inline train::Batch token_batch(std::int64_t batch, std::int64_t seq, std::int64_t vocab) {
  using tensor::Tensor;
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

/// Communication of one device, per timed step (barriers of the timing excluded).
struct CommPerStep {
  double seconds = 0;       // inside communicator calls, waiting for peers included
  double wait_seconds = 0;  // of which waiting for the other devices to arrive
  double bytes_sent = 0;
  std::array<double, comm::kNumOpKinds> calls_by_kind{};  // per kind (comm::OpKind)
  std::array<double, comm::kNumOpKinds> bytes_by_kind{};
  std::array<double, comm::kNumOpKinds> seconds_by_kind{};  // inside the calls, waits included
};

/// What the timed steps of all rounds of one variant gave.
struct Measured {
  std::vector<double> step_times;  // device 0, between barriers
  std::vector<CommPerStep> comm;   // one entry per round: mean over devices and steps
  float loss = 0.f;
  std::int64_t params_per_device = 0;
};

using Counters = std::array<comm::OpCounters, comm::kNumOpKinds>;

/// Adds the counters of `after` - `before` (barriers excluded) to `c`.
inline void add_comm(CommPerStep& c, const Counters& before, const Counters& after) {
  for (int k = 0; k < comm::kNumOpKinds; ++k) {
    if (static_cast<comm::OpKind>(k) == comm::OpKind::Barrier) continue;
    const double bytes = static_cast<double>(after[k].bytes_sent - before[k].bytes_sent);
    c.seconds += after[k].seconds - before[k].seconds;
    c.wait_seconds += after[k].wait_seconds - before[k].wait_seconds;
    c.bytes_sent += bytes;
    c.calls_by_kind[k] += static_cast<double>(after[k].calls - before[k].calls);
    c.bytes_by_kind[k] += bytes;
    c.seconds_by_kind[k] += after[k].seconds - before[k].seconds;
  }
}

/// One variant's training step on this device.
struct DeviceStep {
  std::function<float()> step;  // one step; returns the loss
  std::int64_t params_per_device = 0;
  /// Run on every device before each of the variant's steps, outside the timed span (a
  /// collective is allowed: every device calls it); e.g. the variant's link model.
  std::function<void()> prepare = {};
};

/// One round of one configuration: shared by the devices of one shard_map call, whose body
/// calls run() on every device; collect() afterwards adds the round to the results.
class Round {
 public:
  /// `names`: the variants, in the order run() gets their steps. Each device runs `warmup`
  /// steps of each, then one step of each in turn until `seconds` (at least `min_steps`
  /// of each).
  Round(std::vector<std::string> names, double seconds, int warmup, int min_steps)
      : names_(std::move(names)),
        seconds_(seconds),
        warmup_(warmup),
        min_steps_(min_steps),
        per_device_(names_.size()),
        times_(names_.size()),
        loss_(names_.size()),
        params_(names_.size()) {}

  const std::vector<std::string>& names() const { return names_; }

  /// Inside shard_map, on every device of the mesh.
  void run(spmd::DeviceContext& ctx, const std::vector<DeviceStep>& steps) {
    const std::size_t nv = steps.size();
    std::vector<float> loss(nv);
    for (std::size_t v = 0; v < nv; ++v)
      for (int i = 0; i < warmup_; ++i) {
        if (steps[v].prepare) steps[v].prepare();
        loss[v] = steps[v].step();
      }
    const auto start = Clock::now();
    int n = 0;
    std::vector<std::vector<double>> times(nv);
    std::vector<CommPerStep> comm(nv);
    while (true) {
      for (std::size_t v = 0; v < nv; ++v) {
        if (steps[v].prepare) steps[v].prepare();
        ctx.world().barrier();
        const Counters before = ctx.comm_stats().by_kind;
        const auto t0 = Clock::now();
        loss[v] = steps[v].step();
        add_comm(comm[v], before, ctx.comm_stats().by_kind);
        if (ctx.device() == 0 && v + 1 == nv)
          go_on_ = n + 1 < min_steps_ || seconds_since(start) < seconds_;
        // Every device has finished its step (and device 0 has decided) after this barrier.
        ctx.world().barrier();
        times[v].push_back(seconds_since(t0));
      }
      ++n;
      if (!go_on_) break;
    }
    std::lock_guard lk(mu_);
    for (std::size_t v = 0; v < nv; ++v) {
      CommPerStep c = comm[v];
      c.seconds /= n;
      c.wait_seconds /= n;
      c.bytes_sent /= n;
      for (int k = 0; k < comm::kNumOpKinds; ++k) {
        c.calls_by_kind[k] /= n;
        c.bytes_by_kind[k] /= n;
        c.seconds_by_kind[k] /= n;
      }
      per_device_[v].push_back(c);
      if (ctx.device() == 0) {
        times_[v] = std::move(times[v]);
        loss_[v] = loss[v];
        params_[v] = steps[v].params_per_device;
      }
    }
  }

  /// After the shard_map call: appends this round's steps (device 0) and communication
  /// (mean over devices) to `out`, by variant name.
  void collect(std::map<std::string, Measured>& out) const {
    for (std::size_t v = 0; v < names_.size(); ++v) {
      Measured& m = out[names_[v]];
      m.step_times.insert(m.step_times.end(), times_[v].begin(), times_[v].end());
      m.loss = loss_[v];
      m.params_per_device = params_[v];
      CommPerStep mean;
      const double nd = static_cast<double>(per_device_[v].size());
      for (const auto& c : per_device_[v]) {
        mean.seconds += c.seconds / nd;
        mean.wait_seconds += c.wait_seconds / nd;
        mean.bytes_sent += c.bytes_sent / nd;
        for (int k = 0; k < comm::kNumOpKinds; ++k) {
          mean.calls_by_kind[k] += c.calls_by_kind[k] / nd;
          mean.bytes_by_kind[k] += c.bytes_by_kind[k] / nd;
          mean.seconds_by_kind[k] += c.seconds_by_kind[k] / nd;
        }
      }
      m.comm.push_back(mean);
    }
  }

 private:
  std::vector<std::string> names_;
  double seconds_;
  int warmup_, min_steps_;
  std::atomic<bool> go_on_{true};
  std::mutex mu_;
  std::vector<std::vector<CommPerStep>> per_device_;  // [variant][device]
  std::vector<std::vector<double>> times_;            // [variant], device 0
  std::vector<float> loss_;
  std::vector<std::int64_t> params_;
};

/// A configuration: the names of its variants and how to run one round of it (one
/// shard_map call whose body calls Round::run on every device).
struct RoundSpec {
  std::vector<std::string> variants;
  std::function<void(Round&)> run;
};

/// Every configuration, `rounds` times in alternation (load from other processes hits them
/// alike); `seconds` per variant over all rounds; results by variant name. With `only`
/// non-empty, runs only the configuration whose first variant has that name. Progress goes
/// to stderr, prefixed with `tag`.
inline std::map<std::string, Measured> run_alternating(const std::vector<RoundSpec>& cfgs,
                                                       int rounds, double seconds,
                                                       const std::string& only, const char* tag) {
  std::map<std::string, Measured> out;
  for (int r = 0; r < rounds; ++r)
    for (const RoundSpec& cfg : cfgs) {
      if (!only.empty() && cfg.variants.front() != only) continue;
      // The first round also pays for oneDNN's primitive creation.
      Round round(cfg.variants, seconds * static_cast<double>(cfg.variants.size()) / rounds,
                  r == 0 ? 2 : 1, 3);
      cfg.run(round);
      round.collect(out);
      for (const std::string& v : cfg.variants)
        std::fprintf(stderr, "[%s] round %d %-24s median %.4f s (%zu steps so far)\n", tag, r + 1,
                     v.c_str(), median(out[v].step_times), out[v].step_times.size());
    }
  return out;
}

inline double mean_comm_seconds(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.seconds / static_cast<double>(m.comm.size());
  return s;
}
inline double mean_comm_wait(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.wait_seconds / static_cast<double>(m.comm.size());
  return s;
}
inline double mean_bytes(const Measured& m) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.bytes_sent / static_cast<double>(m.comm.size());
  return s;
}
/// Calls and bytes sent of one kind per step (mean over rounds and devices).
inline double mean_calls(const Measured& m, comm::OpKind k) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.calls_by_kind[static_cast<int>(k)] / static_cast<double>(m.comm.size());
  return s;
}
inline double mean_bytes(const Measured& m, comm::OpKind k) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.bytes_by_kind[static_cast<int>(k)] / static_cast<double>(m.comm.size());
  return s;
}

/// Seconds per step inside calls of one kind, waiting for peers included.
inline double mean_seconds(const Measured& m, comm::OpKind k) {
  double s = 0;
  for (const auto& c : m.comm)
    s += c.seconds_by_kind[static_cast<int>(k)] / static_cast<double>(m.comm.size());
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

/// The 1, 5 and 15 minute load averages.
inline json load_json() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return json::array();
  return json::array({l[0], l[1], l[2]});
}

}  // namespace distjax::bench
