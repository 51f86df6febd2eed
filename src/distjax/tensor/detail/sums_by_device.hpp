// The many-leaf sums of squares (tensor::sums_of_squares, sums_of_squares_f64): the leaves
// of each device go to one kernel call, which a GPU answers with one host sync for all.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

/// out[i] = the sum of squares of xs[i] (f32, checked by the caller) by `family`'s `many`
/// kernel, one call per device of the leaves (in order of first appearance).
template <class F>
std::vector<double> sums_by_device(const char* op, const std::vector<Tensor>& xs,
                                   const F* KernelTable::*family,
                                   void (*F::*many)(const float* const*, const std::int64_t*,
                                                    std::int64_t, double*, Stream)) {
  std::vector<double> out(xs.size(), 0.0);
  std::vector<bool> done(xs.size(), false);
  for (std::size_t first = 0; first < xs.size(); ++first) {
    if (done[first]) continue;
    const Device device = xs[first].device();
    std::vector<std::size_t> at;
    std::vector<const Tensor*> touched;
    for (std::size_t i = first; i < xs.size(); ++i)
      if (!done[i] && xs[i].device() == device) {
        at.push_back(i);
        touched.push_back(&xs[i]);
        done[i] = true;
      }
    count_host_wait(device);
    Dispatch k(op, family, touched);
    std::vector<const float*> ptrs;
    std::vector<std::int64_t> ns;
    for (std::size_t i : at) {
      ptrs.push_back(xs[i].data<float>());
      ns.push_back(xs[i].numel());
    }
    std::vector<double> sums(at.size());
    (k.operator->()->*many)(ptrs.data(), ns.data(), static_cast<std::int64_t>(at.size()), sums.data(),
                 k.stream());
    for (std::size_t j = 0; j < at.size(); ++j) out[at[j]] = sums[j];
  }
  return out;
}

}  // namespace distjax::tensor::detail
