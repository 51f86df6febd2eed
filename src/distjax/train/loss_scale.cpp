#include "distjax/train/loss_scale.hpp"

#include <algorithm>

namespace distjax::train {

void DynamicLossScale::update(bool finite) {
  if (!finite) {
    scale = std::max(scale * backoff_factor, min_scale);
    good_steps = 0;
    skipped_steps += 1;
    return;
  }
  if (++good_steps >= growth_interval) {
    scale *= growth_factor;
    good_steps = 0;
  }
}

}  // namespace distjax::train
