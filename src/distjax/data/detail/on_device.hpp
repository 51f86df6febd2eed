// Private helpers of the loaders: data made on the host handed to the current device with
// one copy per array (none when the current device is the CPU).
#pragma once

#include "distjax/data/array_dataset.hpp"

namespace distjax::data {

inline Tensor to_current_device(const Tensor& t) {
  return t.defined() ? t.to(current_device()) : t;
}

inline train::Batch to_current_device(const train::Batch& b) {
  return b.map([](const Tensor& t) { return t.to(current_device()); });
}

inline ArrayDataset on_current_device(ArrayDataset d) {
  d.inputs = to_current_device(d.inputs);
  d.labels = to_current_device(d.labels);
  return d;
}

}  // namespace distjax::data
