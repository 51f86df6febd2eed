// Small facts about pipeline actions shared by the schedules and their checker.
#pragma once

#include "distjax/parallel/pipeline_schedule.hpp"

namespace distjax::parallel::detail {

using Op = PipelineOp;

/// Whether the action computes (F, B, I, W) rather than transfers.
inline bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

/// Unit-cost durations: F 1, B 2, I 1, W 1, transfers 0.
inline double unit_cost(Op op) {
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

/// The other stage of a transfer (-1 for compute).
inline int peer_of(const PipelineAction& a, const PipelineSchedule& s) {
  switch (a.op) {
    case Op::SendActivation:
    case Op::RecvGrad:
      return s.stage_of(a.chunk + 1);
    case Op::RecvActivation:
    case Op::SendGrad:
      return s.stage_of(a.chunk - 1);
    default:
      return -1;
  }
}

}  // namespace distjax::parallel::detail
