#include "distjax/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

namespace distjax::parallel {

bool is_compute(PipelineOp op) {
  return op == PipelineOp::Forward || op == PipelineOp::Backward ||
         op == PipelineOp::BackwardInput || op == PipelineOp::BackwardWeight;
}

double unit_cost(PipelineOp op) {
  switch (op) {
    case PipelineOp::Forward:
    case PipelineOp::BackwardInput:
    case PipelineOp::BackwardWeight:
      return 1.0;
    case PipelineOp::Backward:
      return 2.0;
    default:
      return 0.0;
  }
}

int PipelineSchedule::peer_of(const PipelineAction& a) const {
  switch (a.op) {
    case PipelineOp::SendActivation:
    case PipelineOp::RecvGrad:
      return stage_of(a.chunk + 1);
    case PipelineOp::RecvActivation:
    case PipelineOp::SendGrad:
      return stage_of(a.chunk - 1);
    default:
      return -1;
  }
}

namespace {

using Op = PipelineOp;

void check_counts(int stages, int microbatches, int virtual_stages) {
  DISTJAX_CHECK(stages >= 1, ConfigError, "[pipeline schedule] stages must be >= 1, got ", stages);
  DISTJAX_CHECK(microbatches >= 1, ConfigError,
                "[pipeline schedule] micro-batches must be >= 1, got ", microbatches);
  DISTJAX_CHECK(virtual_stages >= 1, ConfigError,
                "[pipeline schedule] virtual stages must be >= 1, got ", virtual_stages);
}

// The compute order of every stage, turned into a schedule by inserting the transfers:
// a receive right before the compute that needs it, a send right after the compute
// that produced it, where the neighbouring chunk lives on another stage.
PipelineSchedule with_transfers(ScheduleKind kind, int p, int m, int v,
                                const std::vector<std::vector<PipelineAction>>& compute) {
  PipelineSchedule s{.kind = kind, .stages = p, .microbatches = m, .virtual_stages = v, .actions = {}};
  const int last = p * v - 1;
  s.actions.resize(p);
  for (int st = 0; st < p; ++st) {
    auto& out = s.actions[st];
    for (const PipelineAction& a : compute[st]) {
      const int c = a.chunk;
      if (a.op == Op::Forward) {
        if (c > 0 && s.stage_of(c - 1) != st) out.push_back({Op::RecvActivation, a.microbatch, c});
        out.push_back(a);
        if (c < last && s.stage_of(c + 1) != st)
          out.push_back({Op::SendActivation, a.microbatch, c});
      } else if (a.op == Op::Backward || a.op == Op::BackwardInput) {
        if (c < last && s.stage_of(c + 1) != st) out.push_back({Op::RecvGrad, a.microbatch, c});
        out.push_back(a);
        if (c > 0 && s.stage_of(c - 1) != st) out.push_back({Op::SendGrad, a.microbatch, c});
      } else {
        out.push_back(a);
      }
    }
  }
  return s;
}

}  // namespace

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved1F1B:
      return "interleaved";
    case ScheduleKind::ZeroBubbleH1:
      return "zbh1";
    case ScheduleKind::InterleavedZeroBubble:
      return "interleaved_zb";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                         ScheduleKind::ZeroBubbleH1, ScheduleKind::InterleavedZeroBubble})
    if (to_string(k) == name) return k;
  DISTJAX_THROW(ConfigError, "[pipeline schedule] unknown schedule \"", name,
                "\"; valid: gpipe, 1f1b, interleaved, zbh1, interleaved_zb");
}

std::string to_string(PipelineOp op) {
  switch (op) {
    case Op::Forward:
      return "F";
    case Op::Backward:
      return "B";
    case Op::BackwardInput:
      return "I";
    case Op::BackwardWeight:
      return "W";
    case Op::SendActivation:
      return "send_act";
    case Op::RecvActivation:
      return "recv_act";
    case Op::SendGrad:
      return "send_grad";
    case Op::RecvGrad:
      return "recv_grad";
  }
  return "?";
}

ActionCost uniform_cost(const ActionCosts& costs) {
  return [costs](int, std::size_t, const PipelineAction& a) {
    switch (a.op) {
      case Op::Forward:
        return costs.forward;
      case Op::Backward:
        return costs.backward_input + costs.backward_weight;
      case Op::BackwardInput:
        return costs.backward_input;
      case Op::BackwardWeight:
        return costs.backward_weight;
      default:
        return 0.0;
    }
  };
}

double idle_time(const ScheduleReport& report) {
  return report.bubble_fraction * report.makespan;
}

// The other stage of a transfer (-1 for compute).
std::string describe(const PipelineAction& a, const PipelineSchedule& s) {
  std::ostringstream os;
  os << to_string(a.op) << "(mb " << a.microbatch << ", chunk " << a.chunk;
  if (a.op == Op::SendActivation || a.op == Op::SendGrad) os << " -> stage " << s.peer_of(a);
  if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) os << " <- stage " << s.peer_of(a);
  os << ")";
  return os.str();
}

std::vector<int> PipelineSchedule::chunks_of(int stage) const {
  std::vector<int> out;
  for (int c = 0; c < num_chunks(); ++c)
    if (stage_of(c) == stage) out.push_back(c);
  return out;
}

PipelineSchedule schedule_gpipe(int p, int m) {
  check_counts(p, m, 1);
  std::vector<std::vector<PipelineAction>> compute(p);
  for (int s = 0; s < p; ++s) {
    for (int i = 0; i < m; ++i)
      compute[s].push_back({Op::Forward, i, s});
    for (int i = 0; i < m; ++i)
      compute[s].push_back({Op::Backward, i, s});
  }
  return with_transfers(ScheduleKind::GPipe, p, m, 1, compute);
}

namespace {
// 1F1B's compute order. Warm-up: enough forwards to fill the stages after this one, then
// one forward one backward, then the remaining backwards. With `split`, each B becomes I
// then W, except that stage s runs its first s W late (ZB-H1 as the paper draws it: at
// most p micro-batches between F and W on every stage, stage 0's 1F1B figure), the late
// ones filling the cool-down's waits.
std::vector<std::vector<PipelineAction>> one_f_one_b_order(int p, int m, bool split) {
  check_counts(p, m, 1);
  std::vector<std::vector<PipelineAction>> compute(p);
  for (int s = 0; s < p; ++s) {
    const int warmup = std::min(p - s - 1, m);
    auto& c = compute[s];
    int next_w = 0;
    auto backward = [&](int i, bool late) {
      if (!split) {
        c.push_back({Op::Backward, i, s});
        return;
      }
      c.push_back({Op::BackwardInput, i, s});
      if (!late) c.push_back({Op::BackwardWeight, next_w++, s});
    };
    for (int i = 0; i < warmup; ++i)
      c.push_back({Op::Forward, i, s});
    for (int i = 0; i < m - warmup; ++i) {
      c.push_back({Op::Forward, warmup + i, s});
      backward(i, /*late=*/i < s);
    }
    for (int i = m - warmup; i < m; ++i)
      backward(i, false);
    while (split && next_w < m) c.push_back({Op::BackwardWeight, next_w++, s});
  }
  return compute;
}
}  // namespace

PipelineSchedule schedule_1f1b(int p, int m) {
  return with_transfers(ScheduleKind::OneFOneB, p, m, 1, one_f_one_b_order(p, m, false));
}

namespace {

// The candidates of a kind (a fixed order, greedy simulations with given and unit costs:
// heuristics each): the first of those that idle least when replayed with `costs`.
PipelineSchedule least_idle(const ActionCosts& costs, std::vector<PipelineSchedule> candidates) {
  const ActionCost cost = uniform_cost(costs);
  std::size_t best = 0;
  double best_idle = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const double idle = idle_time(replay_schedule(candidates[k], cost));
    if (idle < best_idle - 1e-12 * std::max(1.0, best_idle)) best = k, best_idle = idle;
  }
  return std::move(candidates[best]);
}

// Megatron-LM's interleaved 1F1B compute order (forwards and full backwards).
std::vector<std::vector<PipelineAction>> interleaved_order(int p, int m, int v) {
  check_counts(p, m, v);
  DISTJAX_CHECK(m % p == 0, ConfigError, "[pipeline schedule] interleaved schedules need "
                "micro-batches (", m, ") to be a multiple of the stages (", p, ")");
  const int total = m * v;
  // Micro-batches go through a chunk in groups of p before the group moves to the
  // stage's next chunk; backwards visit the chunks in reverse. (Megatron runs every
  // forward first when m == p; the warm-up below holds there too, the checker proves it,
  // and with the backward split it idles half as much.)
  auto unit = [&](int k, bool forward, int s) {
    const int local = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    const int chunk = (forward ? local : v - 1 - local) * p + s;
    return PipelineAction{forward ? Op::Forward : Op::Backward, mb, chunk};
  };
  std::vector<std::vector<PipelineAction>> compute(p);
  for (int s = 0; s < p; ++s) {
    const int warmup = std::min(total, (p - s - 1) * 2 + (v - 1) * p);
    auto& c = compute[s];
    for (int k = 0; k < warmup; ++k)
      c.push_back(unit(k, true, s));
    for (int i = 0; i < total - warmup; ++i) {
      c.push_back(unit(warmup + i, true, s));
      c.push_back(unit(i, false, s));
    }
    for (int k = total - warmup; k < total; ++k)
      c.push_back(unit(k, false, s));
  }
  return compute;
}

// The greedy simulations' clock: the first time after t at which a stage becomes free
// (free_at[stage]) or a value arrives (act_at / grad_at[chunk][micro-batch]); infinity if
// none will.
double next_change(double t, double eps, const std::vector<double>& free_at,
                   const std::vector<std::vector<double>>& act_at,
                   const std::vector<std::vector<double>>& grad_at) {
  double soon = std::numeric_limits<double>::infinity();
  for (double f : free_at)
    if (f > t + eps) soon = std::min(soon, f);
  for (const auto* at : {&act_at, &grad_at})
    for (const auto& per_chunk : *at)
      for (double x : per_chunk)
        if (x > t + eps) soon = std::min(soon, x);
  return soon;
}

// The greedy simulation both zero-bubble builders run: the stages compute in turn as time
// advances (to the next moment a stage frees or a value arrives), each free stage running
// the forward or input backward I its builder's `pick` chooses, or else its oldest
// pending weight backward W (which nobody waits for), or idling. Durations from `costs`;
// I of chunk c hands its cotangent to chunk c-1, F its activation to c+1 (the last
// chunk's F makes its own cotangent).
struct ZeroBubbleSim {
  std::vector<std::vector<double>> act_at, grad_at;  // [chunk][mb]: when input / cotangent is there
  std::vector<int> open;                             // [stage]: chunks between F and W
  std::vector<std::deque<PipelineAction>> pending_w;  // [stage]: W not yet run, oldest first
  // [stage]: F or I to run now, null when none can: the builder's choice (it updates its
  // own counters when it returns one).
  using Pick = std::function<std::optional<PipelineAction>(int stage, double t, double eps)>;

  std::vector<std::vector<PipelineAction>> run(int p, int v, int m, ActionCosts costs,
                                               std::size_t work, const std::string& what,
                                               const Pick& pick) {
    const int chunks = p * v, last = chunks - 1;
    constexpr double kNever = std::numeric_limits<double>::infinity();
    act_at.assign(chunks, std::vector<double>(m, kNever));
    grad_at.assign(chunks, std::vector<double>(m, kNever));
    for (int i = 0; i < m; ++i)
      act_at[0][i] = 0;
    open.assign(p, 0);
    pending_w.assign(p, {});
    std::vector<double> free_at(p, 0.0);
    std::vector<std::vector<PipelineAction>> compute(p);
    std::size_t done = 0;
    const double eps =
        1e-9 * std::min({costs.forward, costs.backward_input, costs.backward_weight});
    double t = 0;
    for (std::size_t rounds = 0; done < work; ++rounds) {
      DISTJAX_CHECK(rounds < 16 * work + 16 * static_cast<std::size_t>(p), ScheduleError, what,
                    " made no progress (p=", p, ", m=", m, ", v=", v, ")");
      for (int s = 0; s < p; ++s) {
        if (free_at[s] > t + eps) continue;  // busy
        if (const std::optional<PipelineAction> a = pick(s, t, eps)) {
          if (a->op == Op::Forward) {
            compute[s].push_back(*a);
            ++open[s];
            free_at[s] = t + costs.forward;
            if (a->chunk < last) act_at[a->chunk + 1][a->microbatch] = free_at[s];
            else grad_at[a->chunk][a->microbatch] = free_at[s];
          } else {
            compute[s].push_back({Op::BackwardInput, a->microbatch, a->chunk});
            pending_w[s].push_back({Op::BackwardWeight, a->microbatch, a->chunk});
            free_at[s] = t + costs.backward_input;
            if (a->chunk > 0) grad_at[a->chunk - 1][a->microbatch] = free_at[s];
          }
        } else if (!pending_w[s].empty()) {
          compute[s].push_back(pending_w[s].front());
          pending_w[s].pop_front();
          --open[s];
          free_at[s] = t + costs.backward_weight;
        } else {
          continue;
        }
        ++done;
      }
      const double soon = next_change(t, eps, free_at, act_at, grad_at);
      if (done < work) {
        DISTJAX_CHECK(soon < kNever, ScheduleError, what, " stuck at time ", t, " (p=", p,
                      ", m=", m, ", v=", v, ")");
        t = soon;
      }
    }
    return compute;
  }
};

// A fixed order of forwards and backwards turned zero-bubble: each backward becomes its
// input part I, and the weight parts W (which nobody waits for) run where the stage would
// otherwise wait for its next input, found by simulating the order with `costs` (the
// oldest pending W first; the rest at the end). The forwards and I keep their order; a
// forward waits for W to run first while the stage holds `cap` chunks between F and W
// (what W keeps is about what F keeps), so no stage holds more than `cap`.
std::vector<std::vector<PipelineAction>> fill_weight_backwards(
    int p, int v, int m, const std::vector<std::vector<PipelineAction>>& order,
    ActionCosts costs, int cap) {
  std::vector<std::size_t> next(p, 0);
  std::size_t work = 0;  // every F and I, and a W per I
  for (const auto& l : order)
    for (const PipelineAction& a : l) work += a.op == Op::Forward ? 1 : 2;
  ZeroBubbleSim sim;
  return sim.run(p, v, m, costs, work, "[pipeline schedule] zero-bubble fill",
                 [&](int s, double t, double eps) -> std::optional<PipelineAction> {
                   if (next[s] >= order[s].size()) return std::nullopt;
                   const PipelineAction& a = order[s][next[s]];
                   const bool ready =
                       a.op == Op::Forward
                           ? sim.act_at[a.chunk][a.microbatch] <= t + eps &&
                                 (sim.open[s] < cap || sim.pending_w[s].empty())
                           : sim.grad_at[a.chunk][a.microbatch] <= t + eps;
                   if (!ready) return std::nullopt;
                   ++next[s];
                   return a;
                 });
}

}  // namespace

PipelineSchedule schedule_interleaved(int p, int m, int v) {
  return with_transfers(ScheduleKind::Interleaved1F1B, p, m, v, interleaved_order(p, m, v));
}

PipelineSchedule schedule_interleaved_zb(int p, int m, int v, ActionCosts costs) {
  DISTJAX_CHECK(costs.forward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
                ConfigError, "[schedule_interleaved_zb] action costs must be positive");
  const auto order = interleaved_order(p, m, v);
  // Interleaved 1F1B's peak on stage 0 (its warm-up and one more), on every stage.
  const int cap = std::min(m * v, 2 * (p - 1) + (v - 1) * p + 1);
  const PipelineSchedule tuned = with_transfers(ScheduleKind::InterleavedZeroBubble, p, m, v,
                                                fill_weight_backwards(p, v, m, order, costs, cap));
  return least_idle(costs, {tuned, with_transfers(ScheduleKind::InterleavedZeroBubble, p, m, v,
                                                  fill_weight_backwards(p, v, m, order, {}, cap))});
}

namespace {
PipelineSchedule zbh1_greedy(int p, int m, ActionCosts costs);
}  // namespace


PipelineSchedule schedule_zbh1(int p, int m, ActionCosts costs) {
  DISTJAX_CHECK(costs.forward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
                ConfigError, "[schedule_zbh1] action costs must be positive");
  return least_idle(costs, {with_transfers(ScheduleKind::ZeroBubbleH1, p, m, 1, one_f_one_b_order(p, m, true)),
                            zbh1_greedy(p, m, costs)});
}

namespace {
PipelineSchedule zbh1_greedy(int p, int m, ActionCosts costs) {
  check_counts(p, m, 1);
  DISTJAX_CHECK(costs.forward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
                ConfigError, "[schedule_zbh1] action costs must be positive");
  // ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): the backward is split into its
  // input part I, which the previous stage waits for, and its weight part W, which nobody
  // waits for and fills what would be bubbles. Built by simulating F, I and W with the
  // given durations (the paper profiles them) greedily: I as soon as its cotangent is
  // there, else F while stage s holds fewer than p - s micro-batches between F and I (as
  // 1F1B's warm-up) and fewer than p between F and W (W keeps the linear layers' inputs and
  // output cotangents, about what F keeps: 1F1B's stage-0 memory), else the oldest W.
  // held: between F and I (1F1B's warm-up, p - s); the simulation's open: between F and
  // W, what the stage holds (at most p, stage 0's peak under 1F1B, on every stage).
  std::vector<int> next_f(p, 0), next_i(p, 0), held(p, 0);
  ZeroBubbleSim sim;
  const std::vector<std::vector<PipelineAction>> compute = sim.run(
      p, 1, m, costs, static_cast<std::size_t>(3 * m * p), "[schedule_zbh1]",
      [&](int s, double t, double eps) -> std::optional<PipelineAction> {
        if (next_i[s] < next_f[s] && sim.grad_at[s][next_i[s]] <= t + eps) {
          --held[s];
          return PipelineAction{Op::BackwardInput, next_i[s]++, s};
        }
        if (next_f[s] < m && sim.act_at[s][next_f[s]] <= t + eps && held[s] < p - s &&
            sim.open[s] < p) {
          ++held[s];
          return PipelineAction{Op::Forward, next_f[s]++, s};
        }
        return std::nullopt;
      });
  return with_transfers(ScheduleKind::ZeroBubbleH1, p, m, 1, compute);
}
}  // namespace

PipelineSchedule make_schedule(ScheduleKind kind, int stages, int microbatches,
                               int virtual_stages, ActionCosts costs) {
  DISTJAX_CHECK(virtual_stages == 1 || kind == ScheduleKind::Interleaved1F1B ||
                    kind == ScheduleKind::InterleavedZeroBubble,
                ConfigError, "[pipeline schedule] virtual stages (", virtual_stages,
                ") need an interleaved schedule; ", to_string(kind), " runs one chunk per stage");
  switch (kind) {
    case ScheduleKind::GPipe:
      return schedule_gpipe(stages, microbatches);
    case ScheduleKind::OneFOneB:
      return schedule_1f1b(stages, microbatches);
    case ScheduleKind::Interleaved1F1B:
      return schedule_interleaved(stages, microbatches, virtual_stages);
    case ScheduleKind::ZeroBubbleH1:
      return schedule_zbh1(stages, microbatches, costs);
    case ScheduleKind::InterleavedZeroBubble:
      return schedule_interleaved_zb(stages, microbatches, virtual_stages, costs);
  }
  DISTJAX_THROW(ConfigError, "[pipeline schedule] unknown kind");
}

double schedule_bubble_theory(ScheduleKind kind, int p, int m, int v) {
  const double pm1 = p - 1;
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      return pm1 / (m + pm1);
    case ScheduleKind::Interleaved1F1B:
      return (pm1 / v) / (m + pm1 / v);
    case ScheduleKind::ZeroBubbleH1:
      return pm1 / (3.0 * m + pm1);
    case ScheduleKind::InterleavedZeroBubble:
      return (pm1 / v) / (3.0 * m + pm1 / v);
  }
  return 0;
}

}  // namespace distjax::parallel
