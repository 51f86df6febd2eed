#include "distjax/core/memory_stats.hpp"

#include <cstdio>

namespace distjax {

namespace {
std::string mb(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}
}  // namespace

std::string MemoryStats::str() const {
  return "parameters " + mb(parameters) + ", gradients " + mb(gradients) + ", optimizer state " +
         mb(optimizer_state) + ", activations (peak) " + mb(activations_peak);
}

}  // namespace distjax
