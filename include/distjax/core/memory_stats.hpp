// MemoryStats: the bytes a device holds, by category, as the parts that own them report.
#pragma once

#include <cstdint>
#include <string>

namespace distjax {

/// Bytes one device holds by category. Written by whoever owns the memory (the train
/// step, through its train::Strategy: parameters, gradients and optimizer state after
/// the update, counted by storage; the activation peak of forward and backward) and read
/// from spmd::DeviceContext::memory(); train::Trainer prints it at the end of a run.
struct MemoryStats {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  /// The most bytes of tensor storage the forward and backward pass held beyond what was
  /// alive when the step started (activations, gradients as they are produced,
  /// temporaries).
  std::int64_t activations_peak = 0;

  std::int64_t total() const { return parameters + gradients + optimizer_state + activations_peak; }
  /// "parameters 1.6 MB, gradients 1.6 MB, optimizer state 3.3 MB, activations (peak) 2.1 MB".
  std::string str() const;
};

}  // namespace distjax
