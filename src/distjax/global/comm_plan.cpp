#include "distjax/global/comm_plan.hpp"

#include <iomanip>
#include <sstream>

namespace distjax::global {

namespace {
thread_local PlanRecorder* t_plan = nullptr;  // per device thread, like the tape
}

PlanRecorder* current_plan() {
  return t_plan;
}

void record(PlanEntry e) {
  if (t_plan) t_plan->add(std::move(e));
}

RecordPlan::RecordPlan(PlanRecorder& recorder) : previous_(t_plan) {
  t_plan = &recorder;
}
RecordPlan::~RecordPlan() {
  t_plan = previous_;
}

int PlanRecorder::count(const std::string& collective, const std::string& axes,
                        PlanEntry::Phase phase) const {
  int n = 0;
  for (const auto& e : entries_)
    if (e.collective == collective && (axes.empty() || e.axes == axes) && e.phase == phase) ++n;
  return n;
}

std::int64_t PlanRecorder::bytes(const std::string& collective, const std::string& axes,
                                 PlanEntry::Phase phase) const {
  std::int64_t n = 0;
  for (const auto& e : entries_)
    if (e.collective == collective && (axes.empty() || e.axes == axes) && e.phase == phase)
      n += e.bytes;
  return n;
}

std::string PlanRecorder::str() const {
  std::ostringstream os;
  os << std::left << std::setw(9) << "phase" << std::setw(16) << "op" << std::setw(16)
     << "collective" << std::setw(12) << "axes" << std::right << std::setw(12) << "bytes"
     << "  detail\n";
  std::int64_t total[2] = {0, 0};
  for (const auto& e : entries_) {
    const bool fwd = e.phase == PlanEntry::Phase::Forward;
    total[fwd ? 0 : 1] += e.bytes;
    os << std::left << std::setw(9) << (fwd ? "forward" : "backward") << std::setw(16) << e.op
       << std::setw(16) << e.collective << std::setw(12) << e.axes << std::right << std::setw(12)
       << e.bytes << "  " << e.detail << "\n";
  }
  os << "total: forward " << total[0] << " bytes, backward " << total[1] << " bytes, "
     << entries_.size() << " collectives\n";
  for (const auto& [axis, repeated] : repeated_)
    os << "redundant compute: the devices along \"" << axis << "\" repeat " << std::fixed
       << std::setprecision(1) << 100.0 * repeated / flops_ << "% of the forward FLOPs ("
       << static_cast<long long>(repeated) << " of " << static_cast<long long>(flops_)
       << "): split the batch or the weights over it, or drop it from the mesh\n";
  return os.str();
}

void PlanRecorder::add_compute(const std::string&, double flops,
                               const std::vector<std::string>& repeated_axes) {
  flops_ += flops;
  for (const std::string& a : repeated_axes)
    repeated_[a] += flops;
}

double PlanRecorder::repeated_fraction(const std::string& axis) const {
  const auto it = repeated_.find(axis);
  return it == repeated_.end() || flops_ == 0.0 ? 0.0 : it->second / flops_;
}

}  // namespace distjax::global
