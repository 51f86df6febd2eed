// The many-leaf sums of squares (tensor::sums_of_squares, sums_of_squares_f64): the leaves
// of each device go to one kernel call, which a GPU answers with one host sync for all.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/tensor/detail/group_indices.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

/// out[i] = the sum of squares of xs[i] (f32, checked by the caller) by `family`'s `many`
/// kernel, one call per device of the leaves (in order of first appearance).
template <class F>
std::vector<double> sums_by_device(const char* op, const std::vector<Tensor>& xs,
                                   const F* KernelTable::*family,
                                   void (*F::*many)(const float* const*, const std::int64_t*,
                                                    std::int64_t, double*)) {
  std::vector<double> out(xs.size(), 0.0);
  for (const std::vector<std::size_t>& at :
       group_indices(xs.size(), [&](std::size_t i) { return xs[i].device(); })) {
    std::vector<const Tensor*> touched;
    for (std::size_t i : at) touched.push_back(&xs[i]);
    count_host_wait(xs[at[0]].device());
    Dispatch k(op, family, touched);
    std::vector<const float*> ptrs;
    std::vector<std::int64_t> ns;
    for (std::size_t i : at) {
      ptrs.push_back(xs[i].data<float>());
      ns.push_back(xs[i].numel());
    }
    std::vector<double> sums(at.size());
    (k.operator->()->*many)(ptrs.data(), ns.data(), static_cast<std::int64_t>(at.size()),
                            sums.data());
    for (std::size_t j = 0; j < at.size(); ++j) out[at[j]] = sums[j];
  }
  return out;
}

}  // namespace distjax::tensor::detail
