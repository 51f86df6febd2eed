// Pipeline schedules as data: every kind passes the checker over a grid of counts, holds
// the micro-batches in flight its paper says, and hand-broken schedules are rejected with
// a message naming the stage and the action.
#include "distjax/parallel/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using namespace distjax;
using namespace distjax::parallel;

namespace {

// Index of the first action of `op` on (mb, chunk) in stage st's list.
std::size_t find(const PipelineSchedule& s, int st, PipelineOp op, int mb, int chunk) {
  const auto& l = s.actions[st];
  auto it = std::find(l.begin(), l.end(), PipelineAction{op, mb, chunk});
  EXPECT_NE(it, l.end());
  return static_cast<std::size_t>(it - l.begin());
}

std::string error_of(const PipelineSchedule& s) {
  try {
    check_schedule(s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PipelineSchedule, EveryKindChecksOverAGridOfCounts) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 4, 5, 8, 16}) {
      for (ScheduleKind k :
           {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1}) {
        SCOPED_TRACE(to_string(k) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        ScheduleReport r = check_schedule(make_schedule(k, p, m));
        for (int st = 0; st < p; ++st) {
          // Between F and the end of its backward (B, or W): GPipe all m, 1F1B p - s, ZB-H1
          // 1F1B's stage-0 figure p on every stage (its W run late).
          const int expect_peak = k == ScheduleKind::GPipe     ? m
                                  : k == ScheduleKind::OneFOneB ? std::min(m, p - st)
                                                                : std::min(m, p);
          EXPECT_EQ(r.peak_in_flight[st], expect_peak) << "stage " << st;
        }
      }
      for (int v : {2, 3}) {
        if (m % p != 0) continue;
        SCOPED_TRACE("interleaved p=" + std::to_string(p) + " m=" + std::to_string(m) +
                     " v=" + std::to_string(v));
        const ScheduleReport inter = check_schedule(make_schedule(ScheduleKind::Interleaved1F1B, p, m, v));
        // Interleaved zero bubble holds at most what interleaved 1F1B holds on stage 0.
        const ScheduleReport zb =
            check_schedule(make_schedule(ScheduleKind::InterleavedZeroBubble, p, m, v));
        EXPECT_EQ(zb.peak_in_flight[0], inter.peak_in_flight[0]);
        for (int st = 0; st < p; ++st) EXPECT_LE(zb.peak_in_flight[st], inter.peak_in_flight[0]);
      }
    }
}

TEST(PipelineSchedule, UnitCostBubbleMatchesTheory) {
  const int p = 4;
  for (int m : {4, 8, 16}) {
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
      ScheduleReport r = check_schedule(make_schedule(k, p, m));
      EXPECT_NEAR(r.bubble_fraction, schedule_bubble_theory(k, p, m), 1e-9) << to_string(k) << m;
    }
    // ZB-H1: a third of 1F1B's idle time (p-1 units against 3(p-1)); as a fraction of
    // the makespan that is the theory's (p-1)/(3m+p-1).
    const ScheduleReport one = check_schedule(schedule_1f1b(p, m));
    const ScheduleReport zb = check_schedule(schedule_zbh1(p, m));
    EXPECT_NEAR(zb.bubble_fraction * zb.makespan, one.bubble_fraction * one.makespan / 3, 1e-9);
    EXPECT_NEAR(zb.bubble_fraction, schedule_bubble_theory(ScheduleKind::ZeroBubbleH1, p, m), 1e-9);
    const ScheduleReport inter = check_schedule(schedule_interleaved(p, m, 2));
    EXPECT_NEAR(inter.bubble_fraction,
                schedule_bubble_theory(ScheduleKind::Interleaved1F1B, p, m, 2), 0.01);
    // Interleaved zero bubble: (p-1) chunk forwards of idle, F/v each in a stage's units:
    // 1/(3v) of 1F1B's idle time.
    for (int v : {2, 3}) {
      const ScheduleReport izb = check_schedule(schedule_interleaved_zb(p, m, v));
      EXPECT_NEAR(izb.bubble_fraction * izb.makespan, p - 1, 1e-9) << "v=" << v << " m=" << m;
      EXPECT_NEAR(izb.bubble_fraction * izb.makespan / v,
                  one.bubble_fraction * one.makespan / (3 * v), 1e-9);
      EXPECT_NEAR(izb.bubble_fraction,
                  schedule_bubble_theory(ScheduleKind::InterleavedZeroBubble, p, m, v), 1e-9);
    }
  }
}

TEST(PipelineSchedule, TransfersPairUp) {
  PipelineSchedule s = schedule_1f1b(3, 4);
  // Stage 0 sends mb 0's activation right after its forward; stage 1 receives it right
  // before its forward.
  EXPECT_EQ(find(s, 0, PipelineOp::SendActivation, 0, 0), find(s, 0, PipelineOp::Forward, 0, 0) + 1);
  EXPECT_EQ(find(s, 1, PipelineOp::RecvActivation, 0, 1) + 1, find(s, 1, PipelineOp::Forward, 0, 1));
  // The last stage has no activation to send, the first no cotangent.
  for (const auto& a : s.actions[2]) EXPECT_NE(a.op, PipelineOp::SendActivation);
  for (const auto& a : s.actions[0]) EXPECT_NE(a.op, PipelineOp::SendGrad);
}

TEST(PipelineSchedule, MissingReceiveIsRejected) {
  PipelineSchedule s = schedule_1f1b(4, 4);
  auto& l = s.actions[2];
  l.erase(l.begin() + static_cast<std::ptrdiff_t>(find(s, 2, PipelineOp::RecvActivation, 1, 2)));
  const std::string e = error_of(s);
  EXPECT_NE(e.find("stage 2"), std::string::npos) << e;
  EXPECT_NE(e.find("F(mb 1, chunk 2)"), std::string::npos) << e;
  EXPECT_NE(e.find("never received"), std::string::npos) << e;
}

TEST(PipelineSchedule, MissingComputeIsRejected) {
  // Stage 1 drops everything of micro-batch 1: its forward is missing.
  PipelineSchedule s = schedule_gpipe(2, 2);
  auto& l = s.actions[1];
  l.erase(std::remove_if(l.begin(), l.end(),
                         [](const PipelineAction& a) { return a.microbatch == 1; }),
          l.end());
  const std::string e = error_of(s);
  EXPECT_NE(e.find("stage 1 never runs the forward of micro-batch 1, chunk 1"), std::string::npos)
      << e;
}

TEST(PipelineSchedule, BackwardBeforeForwardIsRejected) {
  PipelineSchedule s = schedule_gpipe(2, 3);
  auto& l = s.actions[0];
  const std::size_t f = find(s, 0, PipelineOp::Forward, 2, 0);
  const std::size_t b = find(s, 0, PipelineOp::Backward, 2, 0);
  std::swap(l[f], l[b]);
  const std::string e = error_of(s);
  EXPECT_NE(e.find("stage 0"), std::string::npos) << e;
  EXPECT_NE(e.find("B(mb 2, chunk 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("backward before its forward"), std::string::npos) << e;
}

TEST(PipelineSchedule, CycleIsRejectedAsDeadlock) {
  // Stage 0 waits for mb 0's cotangent before it sends mb 0's activation: stage 1 cannot
  // run the forward the cotangent comes from.
  PipelineSchedule s = schedule_gpipe(2, 1);
  auto& l = s.actions[0];  // F0 send_act0 recv_grad0 B0
  ASSERT_EQ(l.size(), 4u);
  std::swap(l[1], l[2]);   // F0 recv_grad0 send_act0 B0
  const std::string e = error_of(s);
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 0"), std::string::npos) << e;
  EXPECT_NE(e.find("recv_grad(mb 0, chunk 0 <- stage 1)"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1 waits at action 0 recv_act(mb 0, chunk 1 <- stage 0)"),
            std::string::npos)
      << e;
}

TEST(PipelineSchedule, OutOfOrderReceiveIsRejected) {
  PipelineSchedule s = schedule_gpipe(2, 2);
  auto& l = s.actions[1];
  // Receive mb 1's activation before mb 0's (sent in the other order).
  const std::size_t r0 = find(s, 1, PipelineOp::RecvActivation, 0, 1);
  const std::size_t f0 = find(s, 1, PipelineOp::Forward, 0, 1);
  const std::size_t r1 = find(s, 1, PipelineOp::RecvActivation, 1, 1);
  const std::size_t f1 = find(s, 1, PipelineOp::Forward, 1, 1);
  std::swap(l[r0], l[r1]);
  std::swap(l[f0], l[f1]);
  const std::string e = error_of(s);
  EXPECT_NE(e.find("in order"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1"), std::string::npos) << e;
}

TEST(PipelineSchedule, BadCountsAreConfigErrors) {
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 0, 4), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 2, 0), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 2, 4, 2), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::Interleaved1F1B, 4, 6, 2), ConfigError);
  EXPECT_THROW(parse_schedule_kind("zb"), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::InterleavedZeroBubble, 4, 6, 2), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8, 2), ConfigError);
  EXPECT_THROW(schedule_interleaved_zb(2, 4, 2, {.forward = 0}), ConfigError);
  EXPECT_EQ(parse_schedule_kind("interleaved_zb"), ScheduleKind::InterleavedZeroBubble);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::OneFOneB);
}

TEST(PipelineSchedule, TimelineAndCsv) {
  PipelineSchedule s = schedule_1f1b(2, 2);
  ScheduleReport r = check_schedule(s);
  const std::string t = format_timeline(s, r);
  // Stage 0: F0 F1 . B0 B0 ... ; 2 rows after the title.
  EXPECT_NE(t.find("stage 0 |F0 F1"), std::string::npos) << t;
  EXPECT_NE(t.find("stage 1 |.  F0 B0 B0 F1"), std::string::npos) << t;
  const std::string csv = schedule_csv(s, r);
  EXPECT_EQ(csv.rfind("stage,index,op,microbatch,chunk,peer,start,end\n", 0), 0u);
  EXPECT_NE(csv.find("0,1,send_act,0,0,1,1,1\n"), std::string::npos) << csv;
}

TEST(PipelineSchedule, ZbH1WithProfiledCostsChecksAndBeatsTheUnitSchedule) {
  // With the durations it will run with, the greedy places W where this model's bubbles
  // are: replayed with those durations it idles no more than the unit-cost schedule does.
  const ActionCosts costs{.forward = 1.3, .backward_input = 1.0, .backward_weight = 0.8};
  const ActionCost cost = uniform_cost(costs);
  for (int m : {4, 8, 16}) {
    const PipelineSchedule tuned = schedule_zbh1(4, m, costs);
    const ScheduleReport r = check_schedule(tuned);
    for (int st = 0; st < 4; ++st) EXPECT_LE(r.peak_in_flight[st], 4);
    const double tuned_idle = replay_schedule(tuned, cost).bubble_fraction;
    const double unit_idle = replay_schedule(schedule_zbh1(4, m), cost).bubble_fraction;
    EXPECT_LE(tuned_idle, unit_idle + 1e-12) << "m=" << m;
  }
  EXPECT_THROW(schedule_zbh1(2, 2, {.forward = 0}), ConfigError);
}

TEST(PipelineSchedule, IdleTimeBoundsWithOneChunkPerStage) {
  // The limits docs/pipeline-parallelism.md states, on uniform durations F, I, W (B = I + W
  // for the fused backward). With one chunk per stage, no schedule idles less than (p-1) F
  // per stage: the last stage cannot start before the first micro-batch has gone through
  // the p-1 stages before it, and then has as much to do as every other stage. ZB-H1 idles
  // at least (p-1) max(F, I): stage 0 holds p micro-batches at most, so after its p
  // forwards it waits (p-1) I for the first cotangent, with no W to run. 1F1B idles
  // (p-1)(F + B). So ZB-H1's idle time is at most a third of 1F1B's only while
  // F + B >= 3 max(F, I), and no one-chunk schedule's is below F / (F + B).
  struct Costs {
    double f, i, w;
  };
  for (const Costs c : {Costs{1, 1, 1}, Costs{1.0, 1.05, 1.2}, Costs{1.0, 0.9, 1.1},
                        Costs{1.3, 1.0, 0.8}, Costs{1.0, 1.2, 0.9}})
    for (int p : {2, 4})
      for (int m : {4, 8, 16}) {
        SCOPED_TRACE("F " + std::to_string(c.f) + " I " + std::to_string(c.i) + " W " +
                     std::to_string(c.w) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const ActionCost cost = uniform_cost({c.f, c.i, c.w});  // B = I + W
        auto idle = [&](const PipelineSchedule& s) { return idle_time(replay_schedule(s, cost)); };
        const double floor = (p - 1) * c.f, zb_bound = (p - 1) * std::max(c.f, c.i);
        EXPECT_NEAR(idle(schedule_1f1b(p, m)), (p - 1) * (c.f + c.i + c.w), 1e-9);
        EXPECT_GE(idle(schedule_gpipe(p, m)), floor - 1e-9);
        const PipelineSchedule zb = schedule_zbh1(p, m, {c.f, c.i, c.w});
        EXPECT_GE(idle(zb), zb_bound - 1e-9);
        EXPECT_GE(idle(schedule_zbh1(p, m)), zb_bound - 1e-9);
        // Where W is the largest the tuned schedule reaches the bound.
        if (c.w >= std::max(c.f, c.i)) {
          EXPECT_NEAR(idle(zb), zb_bound, 1e-9);
        }
      }
}

TEST(PipelineSchedule, InterleavedZeroBubbleGoesBelowTheOneChunkFloor) {
  // With v chunks per stage the first micro-batch reaches the last stage after p-1 chunk
  // forwards (F/v each): interleaved zero bubble idles less than any one-chunk schedule
  // can, (p-1) F, and reaches (p-1) F/v where W is the largest: with m >= 2p even with I
  // above F, as stage 0 has forwards left to run while its first cotangent comes back.
  // Durations are a chunk's.
  struct Costs {
    double f, i, w;
  };
  const int p = 4, v = 2;
  for (const Costs c : {Costs{1, 1, 1}, Costs{1.0, 1.05, 1.2}, Costs{1.0, 0.9, 1.1},
                        Costs{1.3, 1.0, 0.8}, Costs{1.0, 1.2, 0.9}})
    for (int m : {4, 8, 16}) {
      SCOPED_TRACE("F " + std::to_string(c.f) + " I " + std::to_string(c.i) + " W " +
                   std::to_string(c.w) + " m=" + std::to_string(m));
      const ActionCost cost = uniform_cost({c.f, c.i, c.w});
      auto idle = [&](const PipelineSchedule& s) { return idle_time(replay_schedule(s, cost)); };
      const PipelineSchedule zb = schedule_interleaved_zb(p, m, v, {c.f, c.i, c.w});
      check_schedule(zb);
      const double one_chunk_floor = (p - 1) * v * c.f;  // a stage's F is v chunk forwards
      EXPECT_GE(idle(zb), (p - 1) * c.f - 1e-9);
      EXPECT_LT(idle(zb), one_chunk_floor);
      EXPECT_LE(idle(zb), idle(schedule_interleaved(p, m, v)) + 1e-9);
      if (c.w >= std::max(c.f, c.i)) {
        // With m = p stage 0 has no forward left to run while its first cotangent comes
        // back, and waits (p-1) I as ZB-H1's does.
        EXPECT_NEAR(idle(zb), (p - 1) * (m >= 2 * p ? c.f : std::max(c.f, c.i)), 1e-9);
      }
    }
}
