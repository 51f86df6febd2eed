// The communication plan of a global-view program: a recorder that logs, op by op, the
// collectives the propagation rules insert (forward, and the transposes the backward
// pass will run), over which mesh axes and how many bytes (what JAX users read in HLO),
// and the compute the devices along a mesh axis repeat (redundant compute).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace distjax::global {

/// One collective of the plan.
struct PlanEntry {
  enum class Phase { Forward, Backward };
  /// The global-view op whose rule inserted it ("matmul", "add", "reshard", ...).
  std::string op;
  /// "all_reduce", "all_gather", "reduce_scatter", "all_to_all".
  std::string collective;
  /// The mesh axes of the group, joined by ','.
  std::string axes;
  /// Bytes this device sends (ring algorithm, the figure comm::CommStats counts).
  std::int64_t bytes = 0;
  Phase phase = Phase::Forward;
  /// What moved: "(8, 16) f32 P(None, None) partial("model") -> P()".
  std::string detail;
};

/// Collects PlanEntry rows while installed on the calling thread (RecordPlan); each
/// simulated device is a thread, so each records its own plan.
///
///   global::PlanRecorder plan;
///   { global::RecordPlan on(plan); auto [loss, grads] = global::value_and_grad(f, params); }
///   std::cout << plan.str();   // one line per collective
///   plan.count("all_reduce", "model", PlanEntry::Phase::Forward);  // 1 for a Megatron block
class PlanRecorder {
 public:
  void add(PlanEntry e) { entries_.push_back(std::move(e)); }
  const std::vector<PlanEntry>& entries() const { return entries_; }
  void clear() { entries_.clear(); }
  /// Entries of one collective over exactly `axes` in one phase ("" axes: any).
  int count(const std::string& collective, const std::string& axes, PlanEntry::Phase phase) const;
  /// Bytes of those entries.
  std::int64_t bytes(const std::string& collective, const std::string& axes,
                     PlanEntry::Phase phase) const;
  /// A table: phase, op, collective, axes, bytes, detail; the totals per phase; and a line
  /// per mesh axis along which the devices repeated compute (see repeated_fraction).
  std::string str() const;

  /// Records `flops` of a global-view op's forward (matmul, attention) on this device,
  /// repeated by the devices along each of `repeated_axes` (size > 1; the output's
  /// sharding neither splits nor holds partial sums over them, so each of those devices
  /// computed this very block).
  void add_compute(const std::string& op, double flops,
                   const std::vector<std::string>& repeated_axes);
  /// The forward FLOPs recorded by add_compute.
  double flops() const { return flops_; }
  /// The share of flops() the devices along `axis` repeated: 0 when the program splits
  /// its work over the axis, 1 when every op computed the same block on each of them
  /// (they could be dropped, or the batch split over the axis).
  double repeated_fraction(const std::string& axis) const;
  /// The axes with repeated compute and their FLOPs.
  const std::map<std::string, double>& repeated_flops() const { return repeated_; }

 private:
  std::vector<PlanEntry> entries_;
  double flops_ = 0.0;
  std::map<std::string, double> repeated_;
};

/// Installs `recorder` on the calling thread for its lifetime (nests; restores the
/// previous one).
class RecordPlan {
 public:
  explicit RecordPlan(PlanRecorder& recorder);
  ~RecordPlan();
  RecordPlan(const RecordPlan&) = delete;
  RecordPlan& operator=(const RecordPlan&) = delete;

 private:
  PlanRecorder* previous_;
};

/// The recorder installed on this thread, or nullptr.
PlanRecorder* current_plan();

/// Appends to the current recorder, if any.
void record(PlanEntry e);

}  // namespace distjax::global
