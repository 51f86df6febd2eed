#include "distjax/train/metrics.hpp"

#include <limits>

#include "distjax/core/error.hpp"

namespace distjax::train {

double Metric::mean() const {
  return count == 0.0 ? std::numeric_limits<double>::quiet_NaN() : sum / count;
}

void Metrics::add(const std::string& name, double sum, double count) {
  Metric& m = values_[name];
  m.sum += sum;
  m.count += count;
}

void Metrics::merge(const Metrics& other) {
  for (const auto& [name, m] : other.values_)
    add(name, m.sum, m.count);
}

const Metric& Metrics::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    std::string known;
    for (const auto& [n, _] : values_)
      known += (known.empty() ? "" : ", ") + n;
    DISTJAX_THROW(InvalidArgument, "[Metrics::at] no metric \"", name,
                  "\"; known: ", known.empty() ? "(none)" : known);
  }
  return it->second;
}

std::map<std::string, double> Metrics::means() const {
  std::map<std::string, double> out;
  for (const auto& [name, m] : values_)
    out[name] = m.mean();
  return out;
}

}  // namespace distjax::train
