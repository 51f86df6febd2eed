// The spans of pipeline steps: idle fractions, the measured bubble, and the measured
// timelines as text and as a Chrome trace (parallel/pipeline.hpp).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distjax/core/error.hpp"
#include "distjax/parallel/pipeline.hpp"

namespace distjax::parallel {

double PipelineTrace::compute_seconds() const {
  double s = 0;
  for (const PipelineSpan& x : spans)
    if (!x.wait) s += x.end - x.start;
  return s;
}

double PipelineTrace::wait_seconds() const {
  double s = 0;
  for (const PipelineSpan& x : spans)
    if (x.wait) s += x.end - x.start;
  return s;
}

double PipelineTrace::idle_fraction() const {
  const double total = end - start;
  return total > 0 ? 1.0 - compute_seconds() / total : 0.0;
}

double pipeline_bubble(spmd::DeviceContext& ctx, const PipelineTrace& trace, bool shared_clock,
                       const mesh::Axes& axis) {
  comm::Communicator& c = ctx.comm(axis);
  const double mine[3] = {trace.start, trace.end, trace.compute_seconds()};
  std::vector<double> all(3 * static_cast<std::size_t>(c.size()));
  c.all_gather(mine, all.data(), 3, DType::F64);
  double first = all[0], last = all[1];
  for (int r = 0; r < c.size(); ++r) {
    first = std::min(first, all[3 * r]);
    last = std::max(last, all[3 * r + 1]);
  }
  double idle = 0;
  for (int r = 0; r < c.size(); ++r) {
    const double span = shared_clock ? last - first : all[3 * r + 1] - all[3 * r];
    idle += span > 0 ? 1.0 - all[3 * r + 2] / span : 0.0;
  }
  return idle / c.size();
}

std::string format_trace_timeline(const std::vector<PipelineTrace>& traces, int width) {
  if (traces.empty()) return "";
  double first = traces[0].start, last = traces[0].end;
  for (const PipelineTrace& t : traces) {
    first = std::min(first, t.start);
    last = std::max(last, t.end);
  }
  const double cell = (last - first) / width;
  std::ostringstream os;
  for (const PipelineTrace& t : traces) {
    std::string row(static_cast<std::size_t>(width), '.');
    for (const PipelineSpan& x : t.spans) {
      if (x.wait || cell <= 0) continue;
      const int a = static_cast<int>((x.start - first) / cell);
      const int b = std::max(a + 1, static_cast<int>((x.end - first) / cell));
      const char op = to_string(x.action.op)[0];
      for (int i = a; i < std::min(b, width); ++i)
        row[static_cast<std::size_t>(i)] = op;
      if (b - a >= 2 && a + 1 < width)
        row[static_cast<std::size_t>(a + 1)] = static_cast<char>('0' + x.action.microbatch % 10);
    }
    os << "stage " << t.stage << " |" << row << "| idle " << static_cast<int>(t.idle_fraction() * 1000) / 10.0
       << "%\n";
  }
  return os.str();
}

std::string chrome_trace_json(const std::vector<PipelineTrace>& traces,
                              const std::vector<int>& devices) {
  DISTJAX_CHECK(traces.size() == devices.size(), InvalidArgument, "[chrome_trace_json] ",
                traces.size(), " traces for ", devices.size(), " devices");
  double first = 0;
  bool any = false;
  for (const PipelineTrace& t : traces)
    if (t.end > t.start) {
      first = any ? std::min(first, t.start) : t.start;
      any = true;
    }
  nlohmann::json events = nlohmann::json::array();
  auto us = [&](double s) { return (s - first) * 1e6; };
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const PipelineTrace& t = traces[i];
    const int pid = devices[i];
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                      {"args", {{"name", "device " + std::to_string(pid) + " (stage " +
                                             std::to_string(t.stage) + ")"}}}});
    double cursor = t.start;
    auto event = [&](const std::string& name, const char* cat, double a, double b) {
      if (b <= a) return;
      events.push_back({{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", us(a)},
                        {"dur", (b - a) * 1e6}, {"pid", pid}, {"tid", 0}});
    };
    for (const PipelineSpan& x : t.spans) {
      event("idle", "idle", cursor, x.start);
      const std::string what = to_string(x.action.op) + " mb " +
                               std::to_string(x.action.microbatch) + " chunk " +
                               std::to_string(x.action.chunk);
      const std::string name = x.wait ? "wait " + what : what;
      event(name, x.wait ? "communication" : "compute", x.start, x.end);
      cursor = std::max(cursor, x.end);
    }
    event("idle", "idle", cursor, t.end);
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace distjax::parallel
