// Pipeline schedules as data: pure functions from (stages, micro-batches, kind, virtual
// stages) to one action list per stage, a checker that proves a schedule runs (every
// send meets its receive, nothing deadlocks, every micro-batch gets its forward and
// backward), and its text timeline and CSV. No devices here: the executor is
// parallel/pipeline.hpp.
//
// Legend: p stages (devices along the "pipe" mesh axis), m micro-batches, v virtual
// stages per device. The model is cut into p*v chunks; chunk c runs on stage c % p (the
// interleaved layout of Megatron-LM: stage s holds chunks s, s+p, s+2p, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"

namespace distjax::parallel {

/// A schedule that cannot run: the message names the stage and the action.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

/// The schedule families.
enum class ScheduleKind {
  GPipe,           ///< all forwards, then all backwards: m micro-batches in flight
  OneFOneB,        ///< 1F1B (PipeDream-flush): warm-up, one forward one backward, cool-down
  Interleaved1F1B, ///< Megatron's interleaved 1F1B over v chunks per stage (m % p == 0)
  ZeroBubbleH1,    ///< ZB-H1: backward split into input and weight parts, 1F1B's memory
  InterleavedZeroBubble,  ///< interleaved 1F1B's order with the backward split as ZB-H1's,
                          ///< weight parts filling the waits (interleaved 1F1B's memory)
};

/// "gpipe", "1f1b", "interleaved", "zbh1", "interleaved_zb".
std::string to_string(ScheduleKind kind);
/// The inverse of to_string; ConfigError listing the valid names otherwise.
ScheduleKind parse_schedule_kind(const std::string& name);

/// What a stage does, in order. Compute actions name a micro-batch and a chunk; transfers
/// go between the stages of neighbouring chunks (activations of chunk c to the stage of
/// c+1, gradients of chunk c's input to the stage of c-1).
enum class PipelineOp : std::uint8_t {
  Forward,         ///< F: chunk forward on one micro-batch (keeps its activations)
  Backward,        ///< B: full backward (input and weight cotangents), frees activations
  BackwardInput,   ///< I: input cotangent only (zero-bubble); weights deferred
  BackwardWeight,  ///< W: the deferred weight cotangents; frees activations
  SendActivation,  ///< send chunk c's output to the stage of chunk c+1
  RecvActivation,  ///< receive chunk c's input from the stage of chunk c-1
  SendGrad,        ///< send the cotangent of chunk c's input to the stage of chunk c-1
  RecvGrad,        ///< receive the cotangent of chunk c's output from the stage of c+1
};

/// One action of a stage.
struct PipelineAction {
  PipelineOp op = PipelineOp::Forward;
  int microbatch = 0;
  int chunk = 0;  ///< global chunk index in [0, p*v)
  bool operator==(const PipelineAction&) const = default;
};

/// "F", "B", "I", "W", "send_act", "recv_act", "send_grad", "recv_grad".
std::string to_string(PipelineOp op);
/// Whether the action computes (F, B, I, W) rather than transfers.
bool is_compute(PipelineOp op);
/// Unit-cost durations: F 1, B 2, I 1, W 1, transfers 0 (what the schedules are drawn and
/// checked with when no profile is given).
double unit_cost(PipelineOp op);
/// A schedule: per stage, the actions it runs in order.
struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  int stages = 1;          ///< p
  int microbatches = 1;    ///< m
  int virtual_stages = 1;  ///< v
  std::vector<std::vector<PipelineAction>> actions;  ///< [stage][i]

  int num_chunks() const { return stages * virtual_stages; }
  /// The stage that runs chunk c.
  int stage_of(int chunk) const { return chunk % stages; }
  /// The chunks stage s holds, in model order.
  std::vector<int> chunks_of(int stage) const;
  /// The other stage of a transfer (-1 for a compute action).
  int peer_of(const PipelineAction& a) const;
};

/// e.g. "F(mb 3, chunk 1)", "send_act(mb 0, chunk 2 -> stage 3)" (the peer from the
/// schedule's stage_of).
std::string describe(const PipelineAction& a, const PipelineSchedule& schedule);

PipelineSchedule schedule_gpipe(int stages, int microbatches);
PipelineSchedule schedule_1f1b(int stages, int microbatches);
PipelineSchedule schedule_interleaved(int stages, int microbatches, int virtual_stages);
/// Durations of a chunk's forward, backward-input and backward-weight (any unit), for
/// schedules built by simulation.
struct ActionCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
};
/// ZB-H1: 1F1B's order with each backward split into I and W, stage s running its first s
/// W late so that they fill the cool-down's waits (the paper's figure), or, where it idles
/// less when replayed with the given durations (profiled ones, as the zero-bubble paper
/// builds its schedules), the order a greedy simulation with them finds. Either holds at
/// most p micro-batches between F and W on every stage: 1F1B's stage-0 memory.
PipelineSchedule schedule_zbh1(int stages, int microbatches, ActionCosts costs = {});
/// Interleaved zero bubble (torchtitan's ScheduleInterleavedZeroBubble): interleaved
/// 1F1B's order of forwards and backwards over v chunks per stage, each backward split into
/// I and W, the W placed where a simulation with `costs` (durations of one chunk's F, I and
/// W) finds the stage waiting for its next input; a forward waits for a W instead where
/// the stage would hold more chunks between F and W than interleaved 1F1B's stage 0 does.
/// With one chunk per stage no schedule idles less than (p-1) F; with v chunks the first
/// input reaches the last stage after (p-1) chunk forwards, F/v each.
PipelineSchedule schedule_interleaved_zb(int stages, int microbatches, int virtual_stages,
                                         ActionCosts costs = {});

/// The schedule of `kind`: compute order per stage (the rules of each paper), with the
/// transfers inserted where a neighbouring chunk lives on another stage (a receive just
/// before the compute that needs it, a send just after the compute that produced it).
/// `costs` are the durations the zero-bubble kinds are built with (ignored by the others).
/// ConfigError on counts it cannot schedule (stages, micro-batches < 1; virtual stages
/// other than 1 outside the interleaved kinds; m not a multiple of p for them).
PipelineSchedule make_schedule(ScheduleKind kind, int stages, int microbatches,
                               int virtual_stages = 1, ActionCosts costs = {});

/// What check_schedule proved and measured, on a unit cost model (F = 1, B = 2, I = W = 1,
/// transfers free): start and end time of every action, and the idle fraction.
struct ScheduleReport {
  std::vector<int> peak_in_flight;  ///< [stage]: most micro-batch chunks forwarded and
                                    ///< not yet fully backwarded (B, or W) at once: the
                                    ///< activations held (W keeps the linear layers'
                                    ///< inputs and output cotangents until it runs)
  std::vector<std::vector<double>> start, end;  ///< [stage][i], unit costs
  double makespan = 0;                          ///< end of the last action
  double bubble_fraction = 0;                   ///< mean over stages of idle / makespan
};

/// Proves before anything runs that `schedule` can run: every (micro-batch, chunk) has
/// exactly one forward and one backward (B, or I then W) on the chunk's stage, in that
/// order; every receive has its forward in the right place; every send is met by the
/// receive of the same (micro-batch, chunk) on the peer stage, in the same order (point-to-
/// point channels are FIFO); and executing the lists (sends never block, a receive waits
/// for its send) finishes: a cycle of stages waiting on each other is a deadlock. Throws
/// ScheduleError naming the stage, the action's index and the action.
ScheduleReport check_schedule(const PipelineSchedule& schedule);

/// The duration of action `index` of `stage` (any unit), for replay_schedule.
using ActionCost = std::function<double(int stage, std::size_t index, const PipelineAction&)>;

/// check_schedule with the given action durations instead of unit costs: the start and end
/// of every action when each stage runs its list in order as soon as its inputs are there
/// (a receive ends when its send has: transfers cost what `cost` gives the receive), and
/// the idle fraction. With durations measured on devices this gives the bubble the
/// schedule has when every device runs on its own core.
ScheduleReport replay_schedule(const PipelineSchedule& schedule, const ActionCost& cost);

/// The same durations for every stage and chunk: F, I and W as given, B = I + W, transfers
/// free.
ActionCost uniform_cost(const ActionCosts& costs);

/// The mean idle time of a stage (bubble_fraction x makespan), in the report's unit.
double idle_time(const ScheduleReport& report);

/// The theoretical idle fraction of `kind`: (p-1)/(m+p-1) for GPipe and 1F1B, with p-1
/// divided by v interleaved, (p-1)/(3m+p-1) for ZB-H1 (F, I and W of equal cost), and
/// (p-1)/v over 3m+(p-1)/v for interleaved zero bubble.
double schedule_bubble_theory(ScheduleKind kind, int stages, int microbatches,
                              int virtual_stages = 1);

/// A text timeline, one row per stage, one cell per unit of time of the report's cost
/// model: "F3" forward of micro-batch 3, "B3" backward, "I3"/"W3" its halves, "." idle
/// (with v > 1 a chunk letter follows: "F3a", "F3b", ...).
std::string format_timeline(const PipelineSchedule& schedule, const ScheduleReport& report);

/// CSV with a header: stage,index,op,microbatch,chunk,peer,start,end (peer: the other
/// stage of a transfer, -1 for compute; times from the report's cost model).
std::string schedule_csv(const PipelineSchedule& schedule, const ScheduleReport& report);

}  // namespace distjax::parallel
