#include "distjax/train/metrics.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/shape_ops.hpp"

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

namespace {

// The values of one-element tensors as doubles, in order, with one host wait per device:
// each device's values are gathered into one tensor there (f32: every floating dtype a
// metric takes widens to it exactly) and read together, instead of one wait per value.
std::vector<double> read_values(const std::vector<const tensor::Tensor*>& values) {
  std::vector<double> out(values.size());
  std::vector<std::pair<Device, std::vector<std::size_t>>> by_device;  // indices, in order
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Device d = values[i]->device();
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& g) { return g.first == d; });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {d, {}});
    it->second.push_back(i);
  }
  for (const auto& [device, idx] : by_device) {
    if (idx.size() == 1) {
      out[idx[0]] = values[idx[0]]->item<double>();
      continue;
    }
    tensor::NoGradGuard no_grad;
    std::vector<tensor::Tensor> ones;
    ones.reserve(idx.size());
    for (std::size_t i : idx) {
      const tensor::Tensor& v = *values[i];
      const tensor::Tensor f = v.dtype() == DType::F32 ? v : tensor::astype(v, DType::F32);
      ones.push_back(f.view({1}));
    }
    const std::vector<float> host = tensor::concat(ones, 0).to_vector<float>();
    for (std::size_t j = 0; j < idx.size(); ++j) out[idx[j]] = host[j];
  }
  return out;
}

}  // namespace

void Metrics::read(const std::string& name) const {
  // The metrics to read (one, or every one with terms), their values read together.
  std::vector<std::map<std::string, std::vector<Term>>::iterator> which;
  if (!name.empty()) {
    const auto it = pending_.find(name);
    if (it == pending_.end()) return;
    which.push_back(it);
  } else {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) which.push_back(it);
  }
  std::vector<const tensor::Tensor*> values;
  for (const auto& it : which)
    for (const Term& t : it->second)
      if (t.value.defined()) values.push_back(&t.value);
  const std::vector<double> read = read_values(values);
  std::size_t k = 0;
  for (const auto& it : which) {
    Metric& m = values_[it->first];
    for (const Term& t : it->second)
      m.sum += t.value.defined() ? read[k++] * t.weight : t.weight;
  }
  for (const auto& it : which) pending_.erase(it);
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
