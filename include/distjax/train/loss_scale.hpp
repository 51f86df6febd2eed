// DynamicLossScale: the loss scale of f16 training (Micikevicius et al., "Mixed Precision
// Training"; PyTorch's GradScaler, JAX jmp's DynamicLossScale), carried in the TrainState.
#pragma once

#include <cstdint>

namespace distjax::train {

/// The dynamic loss scale and its counters, a value kept in TrainState::loss_scale.
/// train_step multiplies the loss by `scale`, divides the gradients by it, and checks
/// that every gradient on every device is finite (through the strategy's global gradient
/// norm, one reduction over the whole mesh, so all devices decide alike):
///  - not finite: the update is skipped (parameters and optimizer state unchanged, the
///    step counter still advances), scale *= backoff_factor (not below min_scale),
///    good_steps = 0, skipped_steps += 1;
///  - finite: the update is applied, good_steps += 1, and after growth_interval finite
///    steps in a row scale *= growth_factor and good_steps = 0.
/// The step's metrics report "loss_scale" (the scale it used) and "skipped_steps".
///
///   state.loss_scale = train::DynamicLossScale{.scale = 32768, .growth_interval = 1000};
struct DynamicLossScale {
  double scale = 32768.0;  // 2^15, PyTorch's GradScaler starts at 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  double min_scale = 1.0;
  std::int64_t good_steps = 0;     // finite steps since the last change of scale
  std::int64_t skipped_steps = 0;  // steps skipped so far

  /// Moves the scale after a step whose gradients were (not) all finite, as above.
  void update(bool finite);
  bool operator==(const DynamicLossScale&) const = default;
};

}  // namespace distjax::train
