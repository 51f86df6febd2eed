#include "distjax/optim/adamw.hpp"

#include "distjax/core/error.hpp"
#include "distjax/optim/detail/leaves.hpp"

namespace distjax::optim {

namespace {
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t slash = path.find('/', start);
    parts.push_back(path.substr(start, slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}
}  // namespace

DecayMask decay_mask_excluding(std::vector<std::string> names,
                               std::vector<std::string> substrings) {
  return [names = std::move(names), substrings = std::move(substrings)](const std::string& path) {
    const std::vector<std::string> parts = split_path(path);
    for (const auto& n : names)
      if (parts.back() == n) return false;
    for (const auto& s : substrings)
      if (path.find(s) != std::string::npos) return false;
    return true;
  };
}

DecayMask default_decay_mask() {
  return [](const std::string& path) {
    const std::vector<std::string> parts = split_path(path);
    const std::string& leaf = parts.back();
    if (leaf == "bias" || leaf == "b" || leaf == "scale" || leaf == "gamma" || leaf == "beta")
      return false;
    for (const auto& c : parts)
      if (c.find("norm") != std::string::npos || c.rfind("ln", 0) == 0) return false;
    return true;
  };
}

AdamW::AdamW(AdamWConfig config) : config_(std::move(config)) {
  DISTJAX_CHECK(config_.learning_rate, InvalidArgument, "[AdamW] learning_rate schedule is empty");
  DISTJAX_CHECK(config_.b1 >= 0.0 && config_.b1 < 1.0 && config_.b2 >= 0.0 && config_.b2 < 1.0,
                InvalidArgument, "[AdamW] betas must lie in [0, 1), got b1=", config_.b1,
                " b2=", config_.b2);
  DISTJAX_CHECK(config_.weight_decay >= 0.0, InvalidArgument,
                "[AdamW] weight_decay must be >= 0, got ", config_.weight_decay);
}

bool AdamW::decays(const std::string& path) const {
  return !config_.decay_mask || config_.decay_mask(path);
}

TensorTree AdamW::init(const TensorTree& params) const {
  return detail::adam_init(params);
}

void AdamW::update(TensorTree& params, const TensorTree& grads, TensorTree& state,
                   std::int64_t step) const {
  const double lr = config_.learning_rate(step);
  detail::adam_update(
      "AdamW", params, grads, state, step, lr, config_.b1, config_.b2, config_.eps,
      [&](const std::string& path) { return decays(path) ? 1.0 - lr * config_.weight_decay : 1.0; },
      0.0);
}

}  // namespace distjax::optim
