#include "distjax/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "distjax/core/error.hpp"

namespace distjax::optim {

Schedule constant_schedule(double value) {
  return [value](std::int64_t) { return value; };
}

Schedule linear_schedule(double init_value, double end_value, std::int64_t transition_steps) {
  DISTJAX_CHECK(transition_steps >= 0, InvalidArgument,
                "[linear_schedule] transition_steps must be >= 0, got ", transition_steps);
  return [=](std::int64_t step) {
    if (transition_steps == 0) return end_value;
    const double frac =
        std::clamp(static_cast<double>(step) / static_cast<double>(transition_steps), 0.0, 1.0);
    return init_value + (end_value - init_value) * frac;
  };
}

Schedule cosine_decay_schedule(double init_value, std::int64_t decay_steps, double alpha) {
  DISTJAX_CHECK(decay_steps > 0, InvalidArgument,
                "[cosine_decay_schedule] decay_steps must be > 0, got ", decay_steps);
  return [=](std::int64_t step) {
    const double frac =
        std::clamp(static_cast<double>(step) / static_cast<double>(decay_steps), 0.0, 1.0);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
    return init_value * ((1.0 - alpha) * cosine + alpha);
  };
}

Schedule warmup_cosine_schedule(double init_value, double peak_value, std::int64_t warmup_steps,
                                std::int64_t decay_steps, double end_value) {
  DISTJAX_CHECK(warmup_steps >= 0 && decay_steps > warmup_steps, InvalidArgument,
                "[warmup_cosine_schedule] need 0 <= warmup_steps < decay_steps, got warmup ",
                warmup_steps, ", decay ", decay_steps);
  return [=](std::int64_t step) {
    if (step < warmup_steps)
      return init_value + (peak_value - init_value) * static_cast<double>(step) /
                              static_cast<double>(warmup_steps);
    const double frac = std::clamp(
        static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps),
        0.0, 1.0);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
    return end_value + (peak_value - end_value) * cosine;
  };
}

}  // namespace distjax::optim
