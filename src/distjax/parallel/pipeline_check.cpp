// The checker of pipeline schedules (check_schedule, replay_schedule) and their text
// timeline and CSV: the execution half of parallel/pipeline_schedule.hpp, still without
// devices.
#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "distjax/parallel/pipeline_schedule.hpp"

namespace distjax::parallel {

using Op = PipelineOp;

namespace {

[[noreturn]] void fail(const PipelineSchedule& s, int stage, std::size_t index,
                       const std::string& what) {
  DISTJAX_THROW(ScheduleError, "[check_schedule] ", to_string(s.kind), " p=", s.stages,
                " m=", s.microbatches, ": stage ", stage, ", action ", index, " ",
                describe(s.actions[stage][index], s), ": ", what);
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
        const int peer = s.peer_of(a);
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
            break;
          case Op::BackwardWeight:  // what the weight cotangents need is held until now
            --held[st];
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
          << describe(s.actions[st][pc[st]], s) << ";";
  }
  if (first_stuck >= 0) {
    const PipelineAction& a = s.actions[first_stuck][pc[first_stuck]];
    const int peer = s.peer_of(a);
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
         << s.peer_of(a) << "," << r.start[st][k] << "," << r.end[st][k] << "\n";
    }
  return os.str();
}

}  // namespace distjax::parallel
