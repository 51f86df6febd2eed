#include "distjax/train/metrics.hpp"

#include <limits>

#include "distjax/core/error.hpp"

namespace distjax::train {

namespace {
// Values one metric keeps on a device before they are read anyway (a host wait), which
// bounds the device memory a run that never reads its metrics holds.
constexpr std::size_t kMaxPendingTerms = 256;
}  // namespace

double Metric::mean() const {
  return count == 0.0 ? std::numeric_limits<double>::quiet_NaN() : sum / count;
}

void Metrics::add(const std::string& name, double sum, double count) {
  Metric& m = values_[name];
  m.count += count;
  // After values still on a device, the sum waits its turn: sums are added in order.
  if (const auto it = pending_.find(name); it != pending_.end())
    it->second.push_back({tensor::Tensor(), sum});
  else
    m.sum += sum;
}

void Metrics::add(const std::string& name, const tensor::Tensor& value, double weight,
                  double count) {
  DISTJAX_CHECK(value.defined() && value.numel() == 1 && is_floating(value.dtype()),
                InvalidArgument, "[Metrics::add] metric \"", name,
                "\" takes one floating element, got ",
                value.defined() ? value.str(0) : std::string("an undefined tensor"));
  if (value.device().kind == DeviceKind::CPU) {
    add(name, value.item<double>() * weight, count);
    return;
  }
  values_[name].count += count;
  auto& terms = pending_[name];
  terms.push_back({value.detach(), weight});
  if (terms.size() >= kMaxPendingTerms) read(name);
}

void Metrics::merge(const Metrics& other) {
  for (const auto& [name, m] : other.values_) {
    const auto terms = other.pending_.find(name);
    if (terms == other.pending_.end()) {
      add(name, m.sum, m.count);
      continue;
    }
    // other's sum holds what came before its terms: add it first, then the terms.
    add(name, m.sum, m.count);
    auto& mine = pending_[name];
    mine.insert(mine.end(), terms->second.begin(), terms->second.end());
    if (mine.size() >= kMaxPendingTerms) read(name);
  }
}

bool Metrics::pending(const std::string& name) const { return pending_.count(name) != 0; }

void Metrics::read(const std::string& name) const {
  auto read_one = [this](const std::string& n, const std::vector<Term>& terms) {
    Metric& m = values_[n];
    for (const Term& t : terms)
      m.sum += t.value.defined() ? t.value.item<double>() * t.weight : t.weight;
  };
  if (!name.empty()) {
    const auto it = pending_.find(name);
    if (it == pending_.end()) return;
    read_one(it->first, it->second);
    pending_.erase(it);
    return;
  }
  for (const auto& [n, terms] : pending_) read_one(n, terms);
  pending_.clear();
}

Metrics::Map::const_iterator Metrics::begin() const {
  read({});
  return values_.begin();
}

const Metric& Metrics::at(const std::string& name) const {
  read(name);
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
  read({});
  std::map<std::string, double> out;
  for (const auto& [name, m] : values_)
    out[name] = m.mean();
  return out;
}

}  // namespace distjax::train
