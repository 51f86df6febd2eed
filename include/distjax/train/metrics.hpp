// Metrics as (sum, count) pairs: merging is exact across minibatches, steps and
// devices, and the mean is taken only when reported. A sum may still be on a device (the
// loss a GPU computed): it is read when the metric is, so a step that only adds its loss
// makes the host wait for nothing.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "distjax/tensor/tensor.hpp"

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
///   m.add("loss", mean_loss_tensor, batch_size, batch_size);  // read when reported
///   m.add("accuracy", num_correct, batch_size);
///   total.merge(m);
///   double acc = total.mean("accuracy");
class Metrics {
 public:
  using Map = std::map<std::string, Metric>;

  /// Adds `sum` and `count` to metric `name` (created if absent).
  void add(const std::string& name, double sum, double count);
  /// Adds value * weight to the sum of metric `name` and `count` to its count, where `value`
  /// is a one-element floating tensor on any device (a loss as the device computed it). On
  /// the CPU it is read at once; elsewhere it stays there, detached from the tape, until
  /// the metric is read (at, mean, means, iterating): the first such read waits for the
  /// device, the others find its work done. Sums keep the order they were added in. A
  /// metric keeps at most 256 values on a device: the one that makes 256 reads them.
  void add(const std::string& name, const tensor::Tensor& value, double weight, double count);
  /// Adds every metric of `other` into this one (values still on a device stay there).
  void merge(const Metrics& other);
  bool contains(const std::string& name) const { return values_.count(name) != 0; }
  /// Whether metric `name` (or, without a name, any metric) has a value still on a device:
  /// reading it makes the host wait for the device.
  bool pending(const std::string& name) const;
  bool pending() const { return !pending_.empty(); }
  /// The metric `name`; throws InvalidArgument listing the known names if absent.
  const Metric& at(const std::string& name) const;
  /// at(name).mean().
  double mean(const std::string& name) const { return at(name).mean(); }
  /// name -> mean, for every metric.
  std::map<std::string, double> means() const;
  bool empty() const { return values_.empty(); }
  void clear() {
    values_.clear();
    pending_.clear();
  }

  /// Every metric, read first.
  Map::const_iterator begin() const;
  Map::const_iterator end() const { return values_.end(); }

 private:
  // value * weight; a sum added after values still on a device: weight alone (no value).
  struct Term {
    tensor::Tensor value;
    double weight = 1.0;
  };
  /// Reads the pending terms of `name` (every metric: empty) into their sums, in the order
  /// they were added.
  void read(const std::string& name) const;

  mutable Map values_;
  mutable std::map<std::string, std::vector<Term>> pending_;  // only names with terms
};

}  // namespace distjax::train
