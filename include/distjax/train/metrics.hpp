// Metrics as (sum, count) pairs: merging is exact across minibatches, steps and
// devices, and the mean is taken only when reported.
#pragma once

#include <map>
#include <string>

namespace distjax::train {

/// One metric: a sum and the count it is over (examples, tokens, steps).
struct Metric {
  double sum = 0.0;
  double count = 0.0;
  /// sum / count (NaN when count is 0).
  double mean() const;
};

/// Named metrics.
///
///   Metrics m;
///   m.add("loss", sum_of_losses, batch_size);
///   m.add("accuracy", num_correct, batch_size);
///   total.merge(m);
///   double acc = total.mean("accuracy");
class Metrics {
 public:
  using Map = std::map<std::string, Metric>;

  /// Adds `sum` and `count` to metric `name` (created if absent).
  void add(const std::string& name, double sum, double count);
  /// Adds every metric of `other` into this one.
  void merge(const Metrics& other);
  bool contains(const std::string& name) const { return values_.count(name) != 0; }
  /// The metric `name`; throws InvalidArgument listing the known names if absent.
  const Metric& at(const std::string& name) const;
  /// at(name).mean().
  double mean(const std::string& name) const { return at(name).mean(); }
  /// name -> mean, for every metric.
  std::map<std::string, double> means() const;
  bool empty() const { return values_.empty(); }
  void clear() { values_.clear(); }

  Map::const_iterator begin() const { return values_.begin(); }
  Map::const_iterator end() const { return values_.end(); }

 private:
  Map values_;
};

}  // namespace distjax::train
