// OpRule: what a propagation rule decides for one op: the sharding each input is moved
// to (reshard), the output's sharding, and the bytes those moves send per device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/global/global_sharding.hpp"

namespace distjax::global {

/// The decision of a propagation rule (pure: no devices). Rules that choose between
/// layouts keep the work split as the inputs split it, then minimise the bytes moved.
struct OpRule {
  std::vector<GlobalSharding> inputs;
  GlobalSharding output;
  std::int64_t bytes = 0;
  std::string str() const;
};

}  // namespace distjax::global
