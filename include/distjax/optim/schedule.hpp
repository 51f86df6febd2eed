// Learning-rate schedules: callables step -> learning rate (constant, linear,
// cosine decay, linear warmup followed by cosine decay), as in optax.
#pragma once

#include <cstdint>
#include <functional>

namespace distjax::optim {

/// A learning rate as a function of the step, where `step` is the number of updates
/// already applied (0 for the first update).
using Schedule = std::function<double(std::int64_t step)>;

/// lr(step) = value.
Schedule constant_schedule(double value);

/// Linear interpolation from `init_value` at step 0 to `end_value` at `transition_steps`,
/// constant afterwards (optax.linear_schedule).
Schedule linear_schedule(double init_value, double end_value, std::int64_t transition_steps);

/// Cosine decay from `init_value` at step 0 to `alpha * init_value` at `decay_steps`,
/// constant afterwards (optax.cosine_decay_schedule).
Schedule cosine_decay_schedule(double init_value, std::int64_t decay_steps, double alpha = 0.0);

/// Linear warmup from `init_value` (step 0) to `peak_value` (step `warmup_steps`), then
/// cosine decay to `end_value` at step `decay_steps` (the total, warmup included),
/// constant afterwards (optax.warmup_cosine_decay_schedule).
///
///   auto lr = warmup_cosine_schedule(0.0, 1e-3, 100, 1000);  // lr(100) == 1e-3
Schedule warmup_cosine_schedule(double init_value, double peak_value, std::int64_t warmup_steps,
                                std::int64_t decay_steps, double end_value = 0.0);

}  // namespace distjax::optim
