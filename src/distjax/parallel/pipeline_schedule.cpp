#include "distjax/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace distjax::parallel {

namespace {

using Op = PipelineOp;

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

double unit_cost(Op op) {
  switch (op) {
    case Op::Forward:
    case Op::BackwardInput:
    case Op::BackwardWeight:
      return 1.0;
    case Op::Backward:
      return 2.0;
    default:
      return 0.0;
  }
}

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
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                         ScheduleKind::Interleaved1F1B, ScheduleKind::ZeroBubbleH1})
    if (to_string(k) == name) return k;
  DISTJAX_THROW(ConfigError, "[pipeline schedule] unknown schedule \"", name,
                "\"; valid: gpipe, 1f1b, interleaved, zbh1");
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

// The other stage of a transfer (-1 for compute).
static int peer_of(const PipelineAction& a, int stages) {
  switch (a.op) {
    case Op::SendActivation:
    case Op::RecvGrad:
      return (a.chunk + 1) % stages;
    case Op::RecvActivation:
    case Op::SendGrad:
      return ((a.chunk - 1) % stages + stages) % stages;
    default:
      return -1;
  }
}

std::string describe(const PipelineAction& a, int stages) {
  std::ostringstream os;
  os << to_string(a.op) << "(mb " << a.microbatch << ", chunk " << a.chunk;
  if (a.op == Op::SendActivation || a.op == Op::SendGrad) os << " -> stage " << peer_of(a, stages);
  if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) os << " <- stage " << peer_of(a, stages);
  os << ")";
  return os.str();
}

std::vector<int> PipelineSchedule::chunks_of(int stage) const {
  std::vector<int> out;
  for (int k = 0; k < virtual_stages; ++k)
    out.push_back(k * stages + stage);
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

PipelineSchedule schedule_1f1b(int p, int m) {
  check_counts(p, m, 1);
  std::vector<std::vector<PipelineAction>> compute(p);
  for (int s = 0; s < p; ++s) {
    // Warm-up: enough forwards to fill the stages after this one, then one forward one
    // backward, then the remaining backwards.
    const int warmup = std::min(p - s - 1, m);
    auto& c = compute[s];
    for (int i = 0; i < warmup; ++i)
      c.push_back({Op::Forward, i, s});
    for (int i = 0; i < m - warmup; ++i) {
      c.push_back({Op::Forward, warmup + i, s});
      c.push_back({Op::Backward, i, s});
    }
    for (int i = m - warmup; i < m; ++i)
      c.push_back({Op::Backward, i, s});
  }
  return with_transfers(ScheduleKind::OneFOneB, p, m, 1, compute);
}

PipelineSchedule schedule_interleaved(int p, int m, int v) {
  check_counts(p, m, v);
  DISTJAX_CHECK(m % p == 0, ConfigError, "[pipeline schedule] interleaved 1F1B needs micro-batches (",
                m, ") to be a multiple of the stages (", p, ")");
  const int total = m * v;
  // Megatron-LM's order: micro-batches go through a chunk in groups of p before the group
  // moves to the stage's next chunk; backwards visit the chunks in reverse.
  auto unit = [&](int k, bool forward, int s) {
    const int local = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    const int chunk = (forward ? local : v - 1 - local) * p + s;
    return PipelineAction{forward ? Op::Forward : Op::Backward, mb, chunk};
  };
  std::vector<std::vector<PipelineAction>> compute(p);
  for (int s = 0; s < p; ++s) {
    const int warmup = m == p ? total : std::min(total, (p - s - 1) * 2 + (v - 1) * p);
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
  return with_transfers(ScheduleKind::Interleaved1F1B, p, m, v, compute);
}

namespace {
PipelineSchedule zbh1_greedy(int p, int m, ActionCosts costs);
}  // namespace

PipelineSchedule schedule_zbh1(int p, int m, ActionCosts costs) {
  const PipelineSchedule tuned = zbh1_greedy(p, m, costs);
  const bool unit = costs.forward == 1.0 && costs.backward_input == 1.0 && costs.backward_weight == 1.0;
  if (unit) return tuned;
  // The greedy is a heuristic: keep the unit-cost order when it idles less under these
  // durations.
  const ActionCost cost = [&](int, std::size_t, const PipelineAction& a) {
    return a.op == Op::Forward         ? costs.forward
           : a.op == Op::BackwardInput ? costs.backward_input
           : a.op == Op::BackwardWeight ? costs.backward_weight
                                        : 0.0;
  };
  PipelineSchedule plain = zbh1_greedy(p, m, {});
  return replay_schedule(tuned, cost).bubble_fraction <= replay_schedule(plain, cost).bubble_fraction
             ? tuned
             : plain;
}

namespace {
PipelineSchedule zbh1_greedy(int p, int m, ActionCosts costs) {
  check_counts(p, m, 1);
  DISTJAX_CHECK(costs.forward > 0 && costs.backward_input > 0 && costs.backward_weight > 0,
                ConfigError, "[schedule_zbh1] action costs must be positive");
  // ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): the backward is split into its
  // input part I, which the previous stage waits for, and its weight part W, which nobody
  // waits for and fills what would be bubbles. Built by simulating F, I and W with the
  // given durations (unit by default; the paper profiles them) greedily: I as soon as its
  // cotangent is there, else F while stage s holds fewer than p - s micro-batches between
  // F and I (1F1B's activation memory; W keeps only what the weight cotangents need: the
  // linear layers' inputs and output cotangents), else the oldest pending W.
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> act_at(p, std::vector<double>(m, kNever));   // input arrives
  std::vector<std::vector<double>> grad_at(p, std::vector<double>(m, kNever));  // cotangent arrives
  for (int i = 0; i < m; ++i)
    act_at[0][i] = 0;
  std::vector<int> next_f(p, 0), next_i(p, 0), held(p, 0);
  std::vector<double> free_at(p, 0.0);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<std::vector<PipelineAction>> compute(p);
  int done = 0;
  const int work = 3 * m * p;
  double t = 0;
  const double eps = 1e-9 * std::min({costs.forward, costs.backward_input, costs.backward_weight});
  for (int rounds = 0; done < work; ++rounds) {
    DISTJAX_CHECK(rounds < 16 * work + 16 * p, ScheduleError, "[schedule_zbh1] no progress (p=",
                  p, ", m=", m, ")");
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > t + eps) continue;  // busy
      const bool can_i = next_i[s] < next_f[s] && grad_at[s][next_i[s]] <= t + eps;
      const bool can_f = next_f[s] < m && act_at[s][next_f[s]] <= t + eps && held[s] < p - s;
      if (can_i) {
        const int i = next_i[s]++;
        compute[s].push_back({Op::BackwardInput, i, s});
        pending_w[s].push_back(i);
        --held[s];
        free_at[s] = t + costs.backward_input;
        if (s > 0) grad_at[s - 1][i] = free_at[s];
      } else if (can_f) {
        const int i = next_f[s]++;
        compute[s].push_back({Op::Forward, i, s});
        ++held[s];
        free_at[s] = t + costs.forward;
        if (s + 1 < p) act_at[s + 1][i] = free_at[s];
        else grad_at[s][i] = free_at[s];
      } else if (!pending_w[s].empty()) {
        compute[s].push_back({Op::BackwardWeight, pending_w[s].front(), s});
        pending_w[s].pop_front();
        free_at[s] = t + costs.backward_weight;
      } else {
        continue;
      }
      ++done;
    }
    // The next moment anything changes: a stage becomes free or a value arrives.
    double next = kNever;
    for (int s = 0; s < p; ++s) {
      if (free_at[s] > t + eps) next = std::min(next, free_at[s]);
      for (int i = 0; i < m; ++i) {
        if (act_at[s][i] > t + eps) next = std::min(next, act_at[s][i]);
        if (grad_at[s][i] > t + eps) next = std::min(next, grad_at[s][i]);
      }
    }
    if (done < work) {
      DISTJAX_CHECK(next < kNever, ScheduleError, "[schedule_zbh1] stuck at time ", t, " (p=", p,
                    ", m=", m, ")");
      t = next;
    }
  }
  return with_transfers(ScheduleKind::ZeroBubbleH1, p, m, 1, compute);
}
}  // namespace

PipelineSchedule make_schedule(ScheduleKind kind, int stages, int microbatches,
                               int virtual_stages) {
  DISTJAX_CHECK(virtual_stages == 1 || kind == ScheduleKind::Interleaved1F1B, ConfigError,
                "[pipeline schedule] virtual stages (", virtual_stages, ") need the interleaved "
                "schedule; ", to_string(kind), " runs one chunk per stage");
  switch (kind) {
    case ScheduleKind::GPipe:
      return schedule_gpipe(stages, microbatches);
    case ScheduleKind::OneFOneB:
      return schedule_1f1b(stages, microbatches);
    case ScheduleKind::Interleaved1F1B:
      return schedule_interleaved(stages, microbatches, virtual_stages);
    case ScheduleKind::ZeroBubbleH1:
      return schedule_zbh1(stages, microbatches);
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
  }
  return 0;
}

namespace {

[[noreturn]] void fail(const PipelineSchedule& s, int stage, std::size_t index,
                       const std::string& what) {
  DISTJAX_THROW(ScheduleError, "[check_schedule] ", to_string(s.kind), " p=", s.stages,
                " m=", s.microbatches, ": stage ", stage, ", action ", index, " ",
                describe(s.actions[stage][index], s.stages), ": ", what);
}

using Key = std::pair<int, int>;  // (micro-batch, chunk)

// Per stage: where each compute and transfer of a (micro-batch, chunk) sits.
struct Positions {
  std::map<Key, std::size_t> f, b, i, w, recv_act, recv_grad, send_act, send_grad;
};

// The checks that need no execution: ranges, placement, counts and order on a stage.
std::vector<Positions> check_static(const PipelineSchedule& s) {
  const int p = s.stages, m = s.microbatches, last = s.num_chunks() - 1;
  DISTJAX_CHECK(static_cast<int>(s.actions.size()) == p, ScheduleError, "[check_schedule] ",
                s.actions.size(), " action lists for ", p, " stages");
  std::vector<Positions> pos(p);
  for (int st = 0; st < p; ++st) {
    Positions& ps = pos[st];
    const auto& list = s.actions[st];
    for (std::size_t k = 0; k < list.size(); ++k) {
      const PipelineAction& a = list[k];
      const Key key{a.microbatch, a.chunk};
      if (a.microbatch < 0 || a.microbatch >= m) fail(s, st, k, "micro-batch out of range");
      if (a.chunk < 0 || a.chunk > last) fail(s, st, k, "chunk out of range");
      if (s.stage_of(a.chunk) != st)
        fail(s, st, k, "chunk " + std::to_string(a.chunk) + " runs on stage " +
                           std::to_string(s.stage_of(a.chunk)));
      auto put = [&](std::map<Key, std::size_t>& where, const char* what) {
        if (!where.emplace(key, k).second)
          fail(s, st, k, std::string("a second ") + what + " of this micro-batch and chunk");
      };
      const bool remote_prev = a.chunk > 0 && s.stage_of(a.chunk - 1) != st;
      const bool remote_next = a.chunk < last && s.stage_of(a.chunk + 1) != st;
      switch (a.op) {
        case Op::Forward:
          put(ps.f, "forward");
          if (remote_prev && !ps.recv_act.count(key))
            fail(s, st, k, "its input is never received (no recv_act before it)");
          break;
        case Op::Backward:
        case Op::BackwardInput:
          if (!ps.f.count(key)) fail(s, st, k, "backward before its forward");
          put(a.op == Op::Backward ? ps.b : ps.i, "backward");
          if (ps.b.count(key) && ps.i.count(key))
            fail(s, st, k, "both a full backward and a split one");
          if (remote_next && !ps.recv_grad.count(key))
            fail(s, st, k, "its output cotangent is never received (no recv_grad before it)");
          break;
        case Op::BackwardWeight:
          if (!ps.i.count(key)) fail(s, st, k, "weight backward before its input backward");
          put(ps.w, "weight backward");
          break;
        case Op::SendActivation:
          if (!remote_next) fail(s, st, k, "the next chunk is on this stage or there is none");
          if (!ps.f.count(key)) fail(s, st, k, "sends an activation before its forward");
          put(ps.send_act, "send_act");
          break;
        case Op::RecvActivation:
          if (!remote_prev) fail(s, st, k, "the previous chunk is on this stage or there is none");
          put(ps.recv_act, "recv_act");
          break;
        case Op::SendGrad:
          if (!remote_prev) fail(s, st, k, "the previous chunk is on this stage or there is none");
          if (!ps.b.count(key) && !ps.i.count(key))
            fail(s, st, k, "sends a cotangent before its backward");
          put(ps.send_grad, "send_grad");
          break;
        case Op::RecvGrad:
          if (!remote_next) fail(s, st, k, "the next chunk is on this stage or there is none");
          put(ps.recv_grad, "recv_grad");
          break;
      }
    }
  }
  // Completeness: every (micro-batch, chunk) forwarded and backwarded on its stage.
  for (int c = 0; c <= last; ++c) {
    const int st = s.stage_of(c);
    const Positions& ps = pos[st];
    for (int mb = 0; mb < m; ++mb) {
      const Key key{mb, c};
      auto missing = [&](const std::string& what) {
        DISTJAX_THROW(ScheduleError, "[check_schedule] ", to_string(s.kind), " p=", p, " m=", m,
                      ": stage ", st, " never runs ", what, " of micro-batch ", mb, ", chunk ", c);
      };
      if (!ps.f.count(key)) missing("the forward");
      if (!ps.b.count(key) && !ps.i.count(key)) missing("the backward");
      if (ps.i.count(key) && !ps.w.count(key)) missing("the weight backward");
    }
  }
  return pos;
}

}  // namespace

ScheduleReport check_schedule(const PipelineSchedule& s) {
  return replay_schedule(s, [](int, std::size_t, const PipelineAction& a) { return unit_cost(a.op); });
}

ScheduleReport replay_schedule(const PipelineSchedule& s, const ActionCost& cost) {
  const int p = s.stages, last = s.num_chunks() - 1;
  check_static(s);
  ScheduleReport r;
  r.peak_in_flight.assign(p, 0);
  r.start.resize(p);
  r.end.resize(p);
  for (int st = 0; st < p; ++st) {
    r.start[st].assign(s.actions[st].size(), 0.0);
    r.end[st].assign(s.actions[st].size(), 0.0);
  }
  // FIFO channels per (from, to, is_grad): the receiver's (micro-batch, chunk), the time
  // the value is ready, the sender's action index.
  struct Msg {
    Key key;
    double time;
    std::size_t index;
  };
  std::map<std::tuple<int, int, bool>, std::deque<Msg>> channel;
  // When each value is available on its stage.
  std::map<Key, double> out_ready, in_ready, grad_out_ready, grad_in_ready;
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> held(p, 0);
  std::vector<double> busy(p, 0.0);

  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      const auto& list = s.actions[st];
      while (pc[st] < list.size()) {
        const std::size_t k = pc[st];
        const PipelineAction& a = list[k];
        const Key key{a.microbatch, a.chunk};
        const int peer = peer_of(a, p);
        double ready = clock[st];
        bool can = true;
        switch (a.op) {
          case Op::Forward:
            if (a.chunk > 0) {  // received, or the previous chunk ran on this stage
              const Key prev{a.microbatch, a.chunk - 1};
              if (in_ready.count(key)) ready = std::max(ready, in_ready[key]);
              else if (out_ready.count(prev)) ready = std::max(ready, out_ready[prev]);
              else can = false;
            }
            break;
          case Op::Backward:
          case Op::BackwardInput:
            if (a.chunk < last) {
              if (grad_out_ready.count(key)) {
                ready = std::max(ready, grad_out_ready[key]);
              } else if (grad_in_ready.count({a.microbatch, a.chunk + 1})) {
                ready = std::max(ready, grad_in_ready[{a.microbatch, a.chunk + 1}]);
              } else {
                can = false;
              }
            } else {
              ready = std::max(ready, out_ready[key]);
            }
            break;
          case Op::RecvActivation:
          case Op::RecvGrad: {
            auto& q = channel[{peer, st, a.op == Op::RecvGrad}];
            if (q.empty()) {
              can = false;
            } else if (q.front().key != key) {
              fail(s, st, k,
                   "the next value stage " + std::to_string(peer) + " sends here is for (mb " +
                       std::to_string(q.front().key.first) + ", chunk " +
                       std::to_string(q.front().key.second) +
                       ") first on this channel (point-to-point is in order)");
            } else {
              ready = std::max(ready, q.front().time);
              q.pop_front();
            }
            break;
          }
          default:
            break;
        }
        if (!can) break;
        const double c = cost(st, k, a);
        const double end = ready + c;
        r.start[st][k] = ready;
        r.end[st][k] = end;
        clock[st] = end;
        if (is_compute(a.op)) busy[st] += c;
        switch (a.op) {
          case Op::Forward:
            out_ready[key] = end;
            r.peak_in_flight[st] = std::max(r.peak_in_flight[st], ++held[st]);
            break;
          case Op::Backward:
            grad_in_ready[key] = end;
            --held[st];
            break;
          case Op::BackwardInput:
            grad_in_ready[key] = end;
            --held[st];
            break;
          case Op::BackwardWeight:
            break;
          case Op::SendActivation:
            channel[{st, peer, false}].push_back({{a.microbatch, a.chunk + 1}, out_ready[key], k});
            break;
          case Op::SendGrad:
            channel[{st, peer, true}].push_back({{a.microbatch, a.chunk - 1}, grad_in_ready[key], k});
            break;
          case Op::RecvActivation:
            in_ready[key] = end;
            break;
          case Op::RecvGrad:
            grad_out_ready[key] = end;
            break;
        }
        ++pc[st];
        progress = true;
      }
    }
  }
  // A receive left waiting: its send never comes, or the stages wait on each other.
  std::ostringstream stuck;
  int first_stuck = -1;
  for (int st = 0; st < p; ++st) {
    if (pc[st] == s.actions[st].size()) continue;
    if (first_stuck < 0) first_stuck = st;
    stuck << " stage " << st << " waits at action " << pc[st] << " "
          << describe(s.actions[st][pc[st]], p) << ";";
  }
  if (first_stuck >= 0) {
    const PipelineAction& a = s.actions[first_stuck][pc[first_stuck]];
    const int peer = peer_of(a, p);
    const bool peer_done = peer >= 0 && pc[peer] == s.actions[peer].size();
    fail(s, first_stuck, pc[first_stuck],
         peer_done ? "stage " + std::to_string(peer) + " never sends it"
                   : "deadlock, the stages wait on each other in a cycle:" + stuck.str());
  }
  for (const auto& [ch, q] : channel) {
    if (q.empty()) continue;
    const int from = std::get<0>(ch);
    fail(s, from, q.front().index,
         "stage " + std::to_string(std::get<1>(ch)) + " never receives it");
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  double idle = 0;
  for (int st = 0; st < p; ++st)
    idle += r.makespan > 0 ? (r.makespan - busy[st]) / r.makespan : 0.0;
  r.bubble_fraction = idle / p;
  return r;
}

std::string format_timeline(const PipelineSchedule& s, const ScheduleReport& r) {
  const int cells = static_cast<int>(r.makespan + 0.5);
  const bool chunks = s.virtual_stages > 1;
  std::vector<std::vector<std::string>> grid(s.stages, std::vector<std::string>(cells, "."));
  std::size_t width = 1;
  for (int st = 0; st < s.stages; ++st) {
    for (std::size_t k = 0; k < s.actions[st].size(); ++k) {
      const PipelineAction& a = s.actions[st][k];
      if (!is_compute(a.op)) continue;
      std::string label = to_string(a.op) + std::to_string(a.microbatch);
      if (chunks) label += static_cast<char>('a' + a.chunk / s.stages);
      width = std::max(width, label.size());
      for (int t = static_cast<int>(r.start[st][k]); t < static_cast<int>(r.end[st][k]); ++t)
        grid[st][t] = label;
    }
  }
  std::ostringstream os;
  os << to_string(s.kind) << " p=" << s.stages << " m=" << s.microbatches;
  if (chunks) os << " v=" << s.virtual_stages;
  os << "  (unit costs: F 1, B 2, I 1, W 1; idle " << static_cast<int>(r.bubble_fraction * 1000) / 10.0
     << "%)\n";
  for (int st = 0; st < s.stages; ++st) {
    os << "stage " << st << " |";
    for (const std::string& c : grid[st])
      os << c << std::string(width - c.size() + 1, ' ');
    os << "\n";
  }
  return os.str();
}

std::string schedule_csv(const PipelineSchedule& s, const ScheduleReport& r) {
  std::ostringstream os;
  os << "stage,index,op,microbatch,chunk,peer,start,end\n";
  for (int st = 0; st < s.stages; ++st)
    for (std::size_t k = 0; k < s.actions[st].size(); ++k) {
      const PipelineAction& a = s.actions[st][k];
      os << st << "," << k << "," << to_string(a.op) << "," << a.microbatch << "," << a.chunk << ","
         << peer_of(a, s.stages) << "," << r.start[st][k] << "," << r.end[st][k] << "\n";
    }
  return os.str();
}

}  // namespace distjax::parallel
